"""Drafting trees: the n-gram and draft-model drafters, extended to propose a draft tree.

A request the scheduler gives a tree (``ScheduledRequest.is_tree``: ``num_draft_tokens`` nodes at
most ``num_speculative_tokens`` deep, ``draft_topk`` children a node) gets one; a chain still goes
through the core drafter (core/drafters.py), whose code these classes only extend:
- ``TreeNgramDrafter``: the continuations of several earlier matches merged into a trie;
- ``TreeDraftModelDrafter``: a catch-up forward, then one forward per depth over the nodes each
  tree expands (``speculation/tree.py``'s ``DraftTree`` decides which), all requests packed together.
  Each expanded node runs at the next scratch slot past the committed tokens, rotated by its
  depth and attending to its ancestors only (``tree_shape.TreeLayout``); a tree's scratch K/V is
  dropped after the proposal and the accepted path is caught up on next time. A step holding a
  tree drafts its chains the same way (a chain is the tree of topk 1), so they share its forwards.
Invariant: every node's parent comes before it; no tree holds more than its shape allows.
Taught in notebooks/06_what_speculation_costs.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.model_runner import ForwardItem
from minispec.core.drafters import DraftModelDrafter, NgramDrafter
from minispec.speculation.tree import DraftTree
from minispec.speculation.tree_verify import verify_tree
from minispec.core.verify import request_draws, verify_exact
from minispec.base.tree_shape import TreeLayout, is_chain, tree_scratch_positions


def verify_drafts(s, target_logits: torch.Tensor):
    """Verify a chain (``verify.verify_exact``) or a draft tree (``tree_verify.verify_tree``) so
    the output keeps the target's law. target_logits: [len(drafts) + 1, V] float32."""
    if is_chain(s.draft_parents):
        return verify_exact(s, target_logits)
    return verify_tree(s, target_logits, request_draws(s))


class TreeNgramDrafter(NgramDrafter):
    """Prompt lookup that drafts a trie of several matches for a request given a tree."""

    def propose(self, scheduled) -> None:
        for s in scheduled:
            if not s.is_tree:
                super().propose([s])
                continue
            s.draft_token_ids, parents = self.lookup_tree(s.request.all_token_ids, s.num_speculative_tokens,
                                                          s.draft_topk, s.num_draft_tokens)
            s.draft_parents = None if is_chain(parents) else parents
            s.draft_probs = None

    def verify(self, scheduled, target_logits):
        return verify_drafts(scheduled, target_logits)

    def lookup_tree(self, tokens: list[int],
                    depth: int, topk: int, num_nodes: int) -> tuple[list[int], list[int]]:
        """A draft tree from several matches: the continuations of the latest matches merged into
        a trie (shared prefixes become one path, a different next token a new branch), latest
        match first, at most ``topk`` children a node and ``num_nodes`` nodes. Returns (tokens,
        parents). With topk 1 it is the chain ``lookup`` proposes."""
        tokens_out: list[int] = []
        parents: list[int] = []
        children: dict[int, dict[int, int]] = {}
        for continuation in self.matches(tokens, depth, 4 * topk):
            node = -1
            for token in continuation:
                kids = children.setdefault(node, {})
                if token not in kids:
                    if len(kids) >= topk or len(tokens_out) >= num_nodes:
                        break
                    kids[token] = len(tokens_out)
                    tokens_out.append(token)
                    parents.append(node)
                node = kids[token]
        return tokens_out, parents


class TreeDraftModelDrafter(DraftModelDrafter):
    """A draft model that drafts a tree for each request given one (see the module doc).
    Args: as DraftModelDrafter."""

    def propose(self, scheduled) -> None:
        if any(s.is_tree for s in scheduled):
            self.propose_trees(scheduled)
        else:
            super().propose(scheduled)  # chains only: the core loop

    def propose_trees(self, scheduled) -> None:
        """A tree per request (a chain is the tree of topk 1): a catch-up forward, then one forward
        per depth over the nodes each tree expands, all requests packed together."""
        live = [(s, item, extra) for s in scheduled for item, extra in [self.catch_up(s)] if item is not None]
        if not live:
            return
        trees = {s.request.request_id: self.new_tree(s) for s, _, _ in live}
        # forward 0: catch up on the tokens the draft has not seen; its last row drafts depth 1
        forward = self.run([item for _, item, _ in live], [extra for _, _, extra in live], first=True)
        for s, _, _ in live:  # counted once run, as in the chain's propose
            self.progress.count_run(s.request.request_id, s.num_catch_up_tokens)
        frontier = {}
        for (s, _, _), logits, hidden in zip(live, forward.logits, forward.hidden):
            tree = trees[s.request.request_id]
            tree.root_hidden = hidden[-1:]
            # a catch-up chunk that stops short of the last token has no logits: no tree this step
            frontier[s.request.request_id] = tree.grow({-1: self.next_dist(s, logits)[0]}) if len(logits) \
                else []
        for _ in range(1, max(s.num_speculative_tokens for s, _, _ in live)):
            active = [s for s, _, _ in live if frontier[s.request.request_id]]
            if not active:
                break
            items, extras = [], []
            for s in active:
                tree, nodes = trees[s.request.request_id], frontier[s.request.request_id]
                items.append(self.node_item(s, tree, nodes))
                parents = [tree.nodes[n].parent for n in nodes]  # each node's input: its parent's hidden row
                extras.append([tree.root_hidden if p < 0 else tree.nodes[p].extra["hidden"] for p in parents])
            forward = self.run(items, extras, first=False)
            for s, logits, hidden in zip(active, forward.logits, forward.hidden):
                tree, nodes = trees[s.request.request_id], frontier[s.request.request_id]
                dists = self.next_dist(s, logits, [tree.path(n) for n in nodes])
                for j, node in enumerate(nodes):
                    tree.nodes[node].extra["hidden"] = hidden[j: j + 1]
                frontier[s.request.request_id] = tree.grow({node: dists[j] for j, node in enumerate(nodes)})
        for s, _, _ in live:
            tree = trees[s.request.request_id]
            tokens, parents, probs, _ = tree.flatten()
            s.draft_token_ids = tokens
            s.draft_parents = None if is_chain(parents) else parents
            s.draft_probs = torch.stack(probs) if tokens and probs[0] is not None else None
            # a chain's drafts sit at their own positions; a tree's at scratch slots, dropped now
            # (the next catch-up runs the accepted path again)
            self.after_drafting(s, sum(1 for n in tree.nodes if n.slot is not None) if tree.topk == 1 else 0)

    # what an EAGLE head (speculation/eagle.py) overrides: its catch-up, forwards, positions and counting
    def scratch_positions(self, s) -> int:
        """Draft slots past the committed tokens that ``s``'s chain or tree writes (tree_shape)."""
        return tree_scratch_positions(s.num_speculative_tokens, s.draft_topk)

    def catch_up(self, s) -> tuple[ForwardItem | None, torch.Tensor | None]:
        """``s``'s catch-up ForwardItem (``DraftModelDrafter.start``) and that forward's extra
        inputs (none for a draft model), or (None, None) when it decodes plainly this step."""
        return self.start(s), None

    def run(self, items: list[ForwardItem], inputs: list, first: bool):
        """One packed draft forward over ``items``. ``inputs``: per item, the catch-up's extra
        inputs (``first``) or its nodes' parents' hidden rows; a draft model reads only tokens."""
        return self.runner.forward(items)

    def scratch_base(self, s) -> int:
        """The draft position of the first draft token: n, past the committed tokens."""
        return s.request.num_tokens

    def after_drafting(self, s, num_run: int) -> None:
        """After proposing: the draft ran ``num_run`` drafts of ``s`` at their own positions."""
        self.progress.count_run(s.request.request_id, num_run)

    def verify(self, scheduled, target_logits):
        return verify_drafts(scheduled, target_logits)

    def new_tree(self, s) -> DraftTree:
        params = s.request.sampling_params
        return DraftTree(s.num_speculative_tokens, s.draft_topk, s.num_draft_tokens, params.greedy,
                         None if params.greedy else request_draws(s), self.confidence_threshold,
                         self.vocab_map if params.greedy else None)

    def node_item(self, s, tree: DraftTree, nodes: list[int]) -> ForwardItem:
        """The ForwardItem that runs ``nodes`` of ``tree``: each to the next free draft slot,
        rotated by its depth, attending to the committed tokens and its ancestors (a chain's
        single node is plain causal)."""
        base = self.scratch_base(s)
        used = sum(1 for n in tree.nodes if n.slot is not None)
        for j, node in enumerate(nodes):
            tree.nodes[node].slot = base + used + j
        tokens = [tree.nodes[n].token for n in nodes]
        layout = None
        if tree.topk > 1:
            visible = []
            for n in nodes:
                seen, a = [], n
                while a >= 0:
                    seen.append(tree.nodes[a].slot)
                    a = tree.nodes[a].parent
                visible.append(sorted(seen))
            layout = TreeLayout(base, [base - 1 + tree.nodes[n].depth for n in nodes], visible)
        return ForwardItem(s.request.request_id, tokens, base + used, len(nodes), layout)
