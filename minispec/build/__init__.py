"""Every builder: ``build_engine`` (engine.py), the KV pool with its scheduler and runner (pool.py),
the drafter and its policy (speculation.py); ``minispec.sim.build_sim_engine`` uses the last two."""

from minispec.build.engine import build_engine

__all__ = ["build_engine"]
