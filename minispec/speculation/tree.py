"""Building one request's draft tree, depth by depth, from a drafter's next-token distributions.

A drafter runs one forward per depth (all requests of the step packed together); after each it
hands every tree the distributions of the nodes it forwarded, and the tree adds their children.
Two rules, both EAGLE-2's expand-then-rerank idea (Li et al. 2024, "EAGLE-2", sec. 4), set how:
- greedy requests: each forwarded node adds its ``topk`` most likely tokens as candidates; the
  ``topk`` best candidates of each new depth (by path probability, the product of the draft's
  probabilities from the root) are forwarded next; at the end the ``num_nodes`` best candidates
  are kept. A node is never less likely than its parent, so the kept set is a tree. Greedy
  verification is exact for any tree.
- sampled requests: rejection sampling over a tree is exact only when the children a node keeps
  are its first draws, made without replacement from its draft distribution, and how many it
  keeps does not depend on what was drawn (recursive rejection sampling, Jeon et al. 2024, sec.
  3). So the tree decides each node's number of children before drawing them, from what it
  already knows: the parent's path probability times the parent's sorted probabilities (the
  best the j-th child can be). Depth by depth it keeps as many nodes as it can spare while one
  node stays for each deeper level, and gives them to the best (parent, rank) pairs.
With ``topk`` 1 both rules give a chain: each depth's most likely token (greedy) or one draw.
A node whose distribution's top probability is below the confidence threshold gets no children
(``SpecConfig.draft_confidence_threshold``; the test reads the distribution, not a draw).
Nodes are numbered in creation order, so a parent always comes before its children.
Used by speculation/tree_drafters.py. Taught in notebooks/06_what_speculation_costs.ipynb (draft trees).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from minispec.core.sampling import DRAFT_DRAW
from minispec.base.tree_shape import tree_shape_error


@dataclass
class Node:
    """One candidate of a draft tree.

    token: the drafted id; parent: index of the parent node (-1: under the request's last token);
    depth: 1 for a root's child position (the first draft position); logp: log path probability
    under the draft; probs: [V] the distribution the node was drawn from (sampled requests) or
    None; slot: where a forwarded node's K/V went in the drafter's cache (None: not forwarded).
    """

    token: int
    parent: int
    depth: int
    logp: float
    probs: torch.Tensor | None = None
    slot: int | None = None
    extra: dict = field(default_factory=dict)  # what a drafter keeps per node (an EAGLE head's feature)


class DraftTree:
    """One request's tree under construction (see the module doc).

    Args:
        depth, topk, num_nodes: the shape (``DraftShape``): deepest level, children per node, nodes
            kept, at most ``tree_shape.max_tree_nodes(depth, topk)`` (each depth expands its topk
            most likely nodes, the ``layer`` forwarded next).
        greedy: the request decodes greedily (top tokens) or samples (draws without replacement).
        draws: the request's ``SeededDraws`` from its first draft position (sampled requests).
        confidence_threshold: a node whose top probability is below this gets no children.
        vocab_map: [V_draft] long, the target id of each of a greedy request's logits columns (a
            draft with a reduced vocabulary, FR-Spec), or None when columns are target ids.
    Raises: ValueError for a shape that cannot hold ``num_nodes`` nodes (``tree_shape_error``).
    """

    def __init__(self, depth: int, topk: int, num_nodes: int, greedy: bool, draws=None,
                 confidence_threshold: float = 0.0, vocab_map: torch.Tensor | None = None):
        error = tree_shape_error(depth, topk, num_nodes)
        if error:
            raise ValueError(error)
        self.depth, self.topk, self.num_nodes = depth, topk, num_nodes
        self.greedy = greedy
        self.draws = draws
        self.threshold = confidence_threshold
        self.vocab_map = vocab_map
        self.nodes: list[Node] = []
        self.layer: list[int] = [-1]  # the nodes to forward next (-1: the root, the request's last token)
        self.built_depth = 0          # depths added so far
        self.root_hidden = None       # what a drafter keeps of the root's row (an EAGLE head's feature)

    # -- growing -------------------------------------------------------------------------------
    def grow(self, dists: dict[int, torch.Tensor]) -> list[int]:
        """Add the next depth's nodes under the nodes just forwarded.

        Args:
            dists: {node index (-1 for the root): what the draft says comes next, [V] float32: for
                a greedy request its logits (ranked as they are, over the draft's own columns when
                ``vocab_map`` names their ids; probabilities are their softmax at temperature 1),
                for a sampled one its processed sampling distribution over the target's ids}.
        Returns: the new depth's nodes to forward next (empty when the tree is complete).
        """
        self.built_depth += 1
        d = self.built_depth
        if self.greedy:
            logits = dists
            dists = {p: torch.softmax(x.float(), dim=-1) for p, x in dists.items()}
        parents = [p for p in self.layer if p in dists and float(dists[p].max()) >= self.threshold]
        new = (self._grow_greedy(parents, logits, dists, d) if self.greedy
               else self._grow_sampled(parents, dists, d))
        self.layer = sorted(new, key=lambda i: (-self.nodes[i].logp, i))[: self.topk]  # forwarded next
        return self.layer if d < self.depth else []

    def _add(self, token: int, parent: int, depth: int, logp: float, probs) -> int:
        self.nodes.append(Node(token, parent, depth, logp, probs))
        return len(self.nodes) - 1

    def _parent_logp(self, p: int) -> float:
        return 0.0 if p < 0 else self.nodes[p].logp

    def _grow_greedy(self, parents: list[int], logits, dists, d: int) -> list[int]:
        new = []
        for p in parents:
            dist = dists[p]
            best = int(logits[p].argmax())  # first: the logits' argmax itself, a chain's draft
            others = torch.topk(logits[p], min(self.topk + 1, dist.shape[-1])).indices.tolist()
            for column in ([best] + [t for t in others if t != best])[: self.topk]:
                prob = float(dist[column])
                if prob > 0:
                    token = int(column) if self.vocab_map is None else int(self.vocab_map[column])
                    new.append(self._add(token, p, d, self._parent_logp(p) + math.log(prob), None))
        return new

    def _grow_sampled(self, parents: list[int], dists, d: int) -> list[int]:
        room = self.num_nodes - len(self.nodes) - (self.depth - d)
        slots = []  # (best possible log path probability of the rank-j child, parent, j)
        for p in parents:
            best = torch.topk(dists[p], min(self.topk, dists[p].shape[-1])).values.tolist()
            slots += [(self._parent_logp(p) + math.log(b), p, j) for j, b in enumerate(best) if b > 0]
        slots.sort(key=lambda s: (-s[0], s[1], s[2]))
        counts: dict[int, int] = {}
        for _, p, _ in slots[:max(room, 0)]:
            counts[p] = counts.get(p, 0) + 1
        new = []
        for p in parents:  # draws without replacement, keyed by depth and rank (rank 0: a chain's draw)
            probs = dists[p]
            left = probs.clone()
            for j in range(counts.get(p, 0)):
                if float(left.sum()) <= 0:
                    break
                token = self.draws.sample(left, d - 1, DRAFT_DRAW, branch=j)
                new.append(self._add(token, p, d,
                                     self._parent_logp(p) + math.log(float(probs[token])), probs))
                left[token] = 0.0
        return new

    def path(self, node: int) -> list[int]:
        """The tokens from the root down to ``node`` (its own last): what a grammar reads before
        the node's children (-1: the root, no tokens)."""
        tokens: list[int] = []
        while node >= 0:
            tokens.append(self.nodes[node].token)
            node = self.nodes[node].parent
        return tokens[::-1]

    # -- the result ----------------------------------------------------------------------------
    def flatten(self) -> tuple[list[int], list[int], list[torch.Tensor | None], list[int]]:
        """The tree to verify: (tokens, parents, draw distributions, kept node indices), parents
        before children. Greedy: the ``num_nodes`` most likely candidates; sampled: every node."""
        if self.greedy:
            order = sorted(range(len(self.nodes)), key=lambda i: (-self.nodes[i].logp, i))[: self.num_nodes]
            kept = sorted(order)
        else:
            kept = list(range(len(self.nodes)))
        index = {old: new for new, old in enumerate(kept)}
        tokens = [self.nodes[i].token for i in kept]
        parents = [-1 if self.nodes[i].parent < 0 else index[self.nodes[i].parent] for i in kept]
        return tokens, parents, [self.nodes[i].probs for i in kept], kept
