"""Draft-tree geometry: a tree's shape, what it holds, and where its nodes sit. Plain lists, no torch.

A draft tree's shape is ``DraftShape(num_speculative_tokens, draft_topk, num_draft_tokens)``: at
most k = ``num_speculative_tokens`` draft positions deep (its depth), at most ``draft_topk``
children per node, ``num_draft_tokens`` nodes verified (SGLang's ``--speculative-num-steps /
-eagle-topk / -num-draft-tokens``). A chain is the tree of topk 1: k nodes, each under the one
before. A tree is a list of parents: node i hangs under node ``parents[i]``, an earlier node, or
under the request's last token (-1, a root). The drafters expand only the ``draft_topk`` most
likely nodes of each depth (EAGLE-2's expand step, Li et al. 2024, sec. 4; SGLang's candidate
pool of topk + (steps - 1) topk^2), so:
- the shape holds at most topk at depth 1 and topk^2 at each deeper depth (``max_tree_nodes``);
- drafting it runs the expanded nodes of every depth but the last through the drafter, each at a
  scratch slot past the committed tokens: topk x (depth - 1) positions (``tree_scratch_positions``).
One definition for SpecConfig's validation, the scheduler's clamp and reservation (``fit_tree``), the
drafters' scratch slots and trees, the verify, the tree attention mask (``TreeLayout``), the simulator's
canonical tree and the cost model's pairs: core, spec and sim all import this file. Invariant: a shape that
passes ``tree_shape_error`` is one the drafters can fill. Taught in notebooks/06_what_speculation_costs.ipynb
(trees); chains in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    if depth >= 0 and topk >= 1 and depth <= num_nodes <= max_tree_nodes(depth, topk):
        return None  # valid, as every step's shape is: no message to build
    shape = f"draft tree depth={depth}, topk={topk}, num_nodes={num_nodes}"
    if depth < 0 or topk < 1:
        return f"{shape}: need depth >= 0 and topk >= 1"
    most = max_tree_nodes(depth, topk)
    holds = "a chain (or depth 0) holds exactly depth nodes" if topk == 1 or depth == 0 else \
        f"a tree of that depth and topk holds at most topk + (depth - 1) x topk^2 = {most}"
    return f"{shape}: need depth <= num_nodes <= {most} ({holds})"


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


@dataclass(frozen=True)
class DraftShape:
    """How much one request drafts in one step: a chain of ``num_speculative_tokens`` (k) tokens,
    or a tree of ``num_draft_tokens`` nodes at most k deep with at most ``draft_topk`` children
    per node. ``num_draft_tokens`` None means k (a chain).

    Raises: ValueError for k below 0, a topk below 1, fewer nodes than k, or more than the shape
    holds (``max_tree_nodes``).
    """

    num_speculative_tokens: int
    draft_topk: int = 1
    num_draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.num_draft_tokens is None:
            object.__setattr__(self, "num_draft_tokens", self.num_speculative_tokens)
        error = tree_shape_error(self.num_speculative_tokens, self.draft_topk, self.num_draft_tokens)
        if error:
            raise ValueError(error)

    @property
    def is_tree(self) -> bool:
        return self.num_draft_tokens > self.num_speculative_tokens

    def fit(self, max_depth: int, max_nodes: int, max_positions: int) -> "DraftShape":
        """The largest shape within this one that fits a request's room (``fit_tree``: draft
        positions it may still accept, nodes the budget leaves, positions before a model's
        maximum length that verifying and drafting write); a chain when no tree fits."""
        k, nodes = fit_tree(self.num_speculative_tokens, self.draft_topk, self.num_draft_tokens,
                            max_depth, max_nodes, max_positions)
        return DraftShape(k, self.draft_topk, nodes) if nodes > k else DraftShape(k)


def node_depths(parents: list[int]) -> list[int]:
    """Each node's depth: a root is at depth 1 (the first draft position)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def tree_depth(parents: list[int]) -> int:
    """The deepest level of a tree (0 for no nodes): the most drafts one verify can accept."""
    return max(node_depths(parents), default=0)


def is_chain(parents: list[int] | None) -> bool:
    """True for no tree (None) or a tree whose every node follows the one before (a chain)."""
    return parents is None or all(p == i - 1 for i, p in enumerate(parents))


def tree_children(parents: list[int]) -> dict[int, list[int]]:
    """{node: its children in proposal order}, with -1 for the roots' parent (the request's last
    token). Nodes without children are absent."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    return children


def expanded_widths(parents: list[int], depth: int, topk: int) -> list[int]:
    """Nodes a drafter forwards at each depth 1..depth-1 of a tree: the depth's nodes, at most
    ``topk`` of them (the expanded ones; the last depth is drafted, never run). A chain: 1 each."""
    depths = node_depths(parents)
    return [min(topk, sum(1 for d in depths if d == j)) for j in range(1, depth)]


def tree_inner_pairs(num_own: int, parents: list[int]) -> int:
    """(query, key) pairs among a run's own tokens (causal) and its draft tree's nodes (each sees
    the own tokens, its ancestors and itself): what a tree verify attends besides the cache."""
    return num_own * (num_own + 1) // 2 + sum(num_own + d for d in node_depths(parents))


def canonical_tree(depth: int, topk: int, num_nodes: int) -> list[int]:
    """The parents of a draft tree of ``num_nodes`` nodes, at most ``depth`` deep and ``topk``
    children per node, shaped as the drafters' allocation shapes one when draft confidence falls
    with rank and depth: depth by depth, as many nodes as can be spared while one node is kept for
    each deeper level, each new node under the most likely of the depth's ``topk`` expanded nodes
    with room (nodes are numbered in that order). A chain when topk is 1. The simulator drafts it
    and the cost model prices it.

    Raises: ValueError when depth < 1, or the shape cannot hold ``num_nodes`` (fewer than depth, or
    more than ``max_tree_nodes``; the message names the values).
    """
    error = tree_shape_error(depth, topk, num_nodes) if depth >= 1 else f"tree depth={depth}: need depth >= 1"
    if error:
        raise ValueError(error)
    parents: list[int] = []
    layer = [-1]
    for d in range(1, depth + 1):
        room = num_nodes - len(parents) - (depth - d)   # nodes this depth may take
        new = []
        # layer is in likelihood order; the drafters expand its topk
        for parent in layer[:topk]:
            for _ in range(topk):
                if len(new) >= room:
                    break
                new.append(len(parents))
                parents.append(parent)
        layer = new
    return parents


@dataclass
class TreeLayout:
    """Where the T tokens of a run that is not a plain causal continuation (a draft tree) sit.

    Token i of the run is written to cache position ``start_pos + i`` (its slot, in row order),
    rotated as sequence position ``positions[i]``, and attends to cache positions
    ``0..prefix_len-1`` (the committed context) plus those in ``visible[i]`` (the slots of its
    ancestors inside the tree, and its own): tree attention (Miao et al. 2024, SpecInfer, sec. 4.2).

    Args:
        prefix_len: context positions every token of the run sees.
        positions: [T] sequence positions (for the rotary embedding).
        visible: per token, the cache positions >= prefix_len it may attend, its own included.
    """

    prefix_len: int
    positions: list[int]
    visible: list[list[int]]

    @classmethod
    def from_parents(cls, start_pos: int, parents: list[int]) -> "TreeLayout":
        """The layout of a run starting at ``start_pos`` whose token i hangs under token
        ``parents[i]`` of the same run (-1: under the committed context, i.e. a root). Parents
        come before their children. A chain (parents i - 1) gives the causal layout.

        Raises: ValueError for a parent that is not an earlier token of the run.
        """
        depth, visible = [], []
        for i, parent in enumerate(parents):
            if not -1 <= parent < i:
                raise ValueError(f"token {i} of a tree has parent {parent}: "
                                 "a parent must be -1 or an earlier token")
            depth.append(0 if parent < 0 else depth[parent] + 1)
            visible.append(([] if parent < 0 else visible[parent]) + [start_pos + i])
        return cls(start_pos, [start_pos + d for d in depth], visible)
