"""The core: the eleven files of docs/architecture.md's reading order, and nothing else.

They run a request from ``Engine.add_request`` to its output, chain speculation included:
request, batch, block_manager, scheduler, model_runner, attention, sampling, executor, engine,
verify, drafters. ``support/`` holds what the core calls but a first reading can skip (where an
output ends, the counters a step fills, tokens to text). Every extension (the prefix cache, the
guards, draft trees, CUDA graphs, structured output) lives outside this folder and wraps or
subclasses what is here; nothing in this folder imports it (import-linter, pyproject.toml).
"""
