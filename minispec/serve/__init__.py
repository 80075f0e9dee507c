"""Serving: minispec's engine behind an OpenAI-compatible HTTP API, and a client to benchmark any such server.

One background thread owns the Engine (engine_loop.py); the ASGI app (app.py) only validates
requests (protocol.py), queues them for that thread and streams back what it emits; metrics.py
exposes Prometheus counters under vLLM's names; client_bench.py drives the same workloads as
minispec/tools/bench.py over HTTP; launch.py starts ``python -m minispec serve`` as a child process.
Invariant: only the engine thread touches the Engine, and every accepted request ends with exactly
one final event (stop, length, abort or error), so its KV blocks always come back.
Taught in docs/production.md.
"""

from minispec.serve.app import create_app
from minispec.serve.engine_loop import EngineLoop
from minispec.serve.launch import launch_server

__all__ = ["create_app", "EngineLoop", "launch_server"]
