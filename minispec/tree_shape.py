"""Draft-tree geometry: how many nodes a tree shape holds and how many positions drafting it writes.

A draft tree's shape is (depth, topk, nodes): at most ``depth`` draft positions deep, at most
``topk`` children per node, ``nodes`` verified. The drafters grow a tree depth by depth and expand
only the ``topk`` most likely nodes of each depth (EAGLE-2's expand step, Li et al. 2024, sec. 4;
SGLang's candidate pool of ``topk + (steps - 1) topk^2``), so:
- the shape holds at most topk at depth 1 and topk^2 at each deeper depth (``max_tree_nodes``);
- drafting it runs the expanded nodes of every depth but the last through the drafter, each at a
  scratch slot past the committed tokens: topk x (depth - 1) positions (``tree_scratch_positions``).
A chain is the tree of topk 1: it holds its depth and drafting it writes depth - 1 positions.
One definition for SpecConfig's validation, ``DraftShape``, the scheduler's clamp and reservation
(``fit_tree``), the drafters' scratch slots and the simulator's canonical tree. Invariant: a shape
that passes ``tree_shape_error`` is one the drafters can fill. Plain arithmetic: no torch.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations


def max_tree_nodes(depth: int, topk: int) -> int:
    """The most nodes a draft tree of ``depth`` levels and ``topk`` children per node holds when
    each depth expands its ``topk`` most likely nodes: topk + (depth - 1) x topk^2 (0 for depth 0;
    ``depth`` for a chain, topk 1).

    Args: depth: draft positions, >= 0; topk: children per node, >= 1 (both ints, in tokens).
    Returns: the node count (int).
    """
    return 0 if depth <= 0 else topk + (depth - 1) * topk * topk


def tree_scratch_positions(depth: int, topk: int) -> int:
    """Positions past a request's committed tokens that drafting a tree of this shape writes in
    the drafter's own KV cache: up to ``topk`` forwarded nodes at each depth but the last (the
    last depth's tokens are drafted, never run). A chain of k writes k - 1.

    Args: depth: draft positions, >= 0; topk: children per node, >= 1.
    Returns: positions (int, tokens).
    """
    return topk * max(depth - 1, 0)


def tree_shape_error(depth: int, topk: int, num_nodes: int) -> str | None:
    """What is wrong with the shape (a message naming the values and what is allowed), or None.

    Allowed: depth >= 0, topk >= 1, depth <= num_nodes <= ``max_tree_nodes(depth, topk)`` (a chain,
    topk 1, has exactly depth nodes).
    """
    shape = f"draft tree depth={depth}, topk={topk}, num_nodes={num_nodes}"
    if depth < 0 or topk < 1:
        return f"{shape}: need depth >= 0 and topk >= 1"
    most = max_tree_nodes(depth, topk)
    if not depth <= num_nodes <= most:
        holds = "a chain holds exactly depth nodes" if topk == 1 else \
            f"a tree of that depth and topk holds at most topk + (depth - 1) x topk^2 = {most}"
        return f"{shape}: need depth <= num_nodes <= {most} ({holds})"
    return None


def fit_tree(depth: int, topk: int, num_nodes: int, max_depth: int, max_nodes: int,
             max_positions: int) -> tuple[int, int]:
    """The largest tree within the shape (depth, topk, num_nodes) that fits a request's room.

    Args:
        max_depth: draft positions the request may still accept (its tokens left before max_tokens).
        max_nodes: nodes the step's token budget leaves for it.
        max_positions: positions past its committed tokens that the target's verify (one per node)
            and the drafter's scratch slots (``tree_scratch_positions``) may write before a model's
            maximum length.
    Returns: (depth, num_nodes), both ints >= 0 with depth <= num_nodes <= max_tree_nodes(depth,
        topk); num_nodes == depth means a chain. Near the end of a sequence the tree loses depth
        first (its width stays topk), then nodes; it never grows past the shape it was given.
    """
    deepest = 1 + max_positions // topk if max_positions >= 0 else 0  # scratch topk (depth - 1) fits
    depth = max(0, min(depth, max_depth, max_nodes, max_positions, deepest))
    return depth, max(depth, min(num_nodes, max_nodes, max_positions, max_tree_nodes(depth, topk)))
