"""Tooling around the engine, not part of it: workloads (closed-loop, Poisson, lanes) and the
bench rows and tables the cli, the simulator's sweeps, the server's client and the course print."""
