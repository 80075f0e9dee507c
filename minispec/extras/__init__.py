"""The extras: each file wraps or subclasses one piece of the core, which imports none of them.

- prefix_cache: the BlockManager with full blocks shared by their tokens (notebook 09).
- engine_guard, drafter_guard: the Engine and any Drafter, with each failure kept to its request.
- acceptance_watch: an engine observer that warns when speculation stops paying (04, 07).
- tree_executor: the ModelExecutor verifying a draft tree in one forward (06).
- cuda_graphs: the ModelRunner replaying a step from a recorded CUDA graph (01).
- grammar, grammar_executor: structured output's matchers, masks and drafts in a step (07).
docs/architecture.md's extras table names where to start reading each.
"""
