"""Verify a draft tree: several candidates per position, one target forward, one accepted path.

A drafter may propose several candidates per position (a draft tree: each node's parent is
another node or the request's last token; ``tree_shape.TreeLayout`` is how the target attends
them). Greedy: follow the child that equals the target's argmax from the root down; the first
node with no such child emits the target's token. Sampling: at each node the children are tested
one after another by recursive rejection sampling (Jeon et al. 2024, "Recursive Speculative
Decoding", Alg. 1; SpecInfer's multi-round rule, Miao et al. 2024, sec. 4.3, for draws with
replacement): child j is accepted with probability min(1, target_j[x] / draft_j[x]), where
draft_j is the draft distribution without the children already tried (the children are draws
without replacement) and target_j the residual left by the earlier rejections,
max(0, target_{j-1} - draft_{j-1}) renormalised; if every child is rejected the target's token is
drawn from the last residual. A deterministic drafter's child is a point mass (its residual just
drops that token), so a duplicate child is rejected for free. The emitted tokens keep the
target's distribution exactly. A chain goes through minispec/core/verify.py.
Invariant: 1 <= emitted <= depth + 1, and emitted[:-1] are the accepted path's tokens, root first.
Taught in notebooks/06_what_speculation_costs.ipynb (trees) after notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.sampling import as_draws, logits_to_probs
from minispec.base.tree_shape import tree_children, tree_depth


def verify_tree(s: ScheduledRequest, target_logits: torch.Tensor, draws) -> EmittedTokens:
    """Verify the draft tree of ``s`` exactly: greedy for a greedy request, recursive rejection
    sampling otherwise. target_logits: [N + 1, V] float32 (row 0 after the request's last token,
    row 1 + i after node i); draws: the request's ``SeededDraws`` from its first draft position."""
    drafts, parents, params = s.draft_token_ids, s.draft_parents, s.request.sampling_params
    if params.greedy:
        emitted, path = verify_tree_greedy(drafts, parents, target_logits)
    else:
        emitted, path = verify_tree_sampled(drafts, parents, s.draft_probs,
                                            logits_to_probs(target_logits, params), draws)
    return EmittedTokens(emitted, len(drafts), len(path), accepted_nodes=path,
                         num_speculative_tokens=tree_depth(parents))


def verify_tree_greedy(draft_token_ids: list[int], parents: list[int],
                       target_logits: torch.Tensor) -> tuple[list[int], list[int]]:
    """Greedy verification of a draft tree.

    Args:
        draft_token_ids: the N nodes' tokens; parents: each node's parent (-1 = a root).
        target_logits: [N + 1, V]: row 0 scores the token after the request's last token, row
            1 + i the token after node i.
    Returns: (emitted tokens: the accepted path then the correction or bonus, accepted path as
        node indices).
    """
    target_ids = target_logits.argmax(dim=-1).tolist()
    children = tree_children(parents)
    node, path = -1, []
    while True:
        token = target_ids[node + 1]
        match = next((c for c in children.get(node, ()) if draft_token_ids[c] == token), None)
        if match is None:
            return [draft_token_ids[n] for n in path] + [token], path
        path.append(match)
        node = match


def verify_tree_sampled(draft_token_ids: list[int], parents: list[int], draft_probs: torch.Tensor | None,
                        target_probs: torch.Tensor, draws) -> tuple[list[int], list[int]]:
    """Recursive rejection sampling over a draft tree (see the module doc).

    Args:
        draft_token_ids, parents: the tree, as in :func:`verify_tree_greedy`.
        draft_probs: [N, V]: row i is the distribution node i was drawn from (its parent's; the
            children of a node are draws without replacement from it), or None for a
            deterministic drafter (every child a point mass).
        target_probs: [N + 1, V] the target's processed distributions, rows as the logits'.
        draws: the request's ``SeededDraws`` from its first draft's output position: depth d's
            j-th candidate tests with uniform(d, branch=j), the last residual draws sample(d).
    Returns: (emitted tokens, accepted path as node indices). A child whose id is outside [0, V),
        or that its draft distribution gives no mass once the earlier children are removed (a
        duplicate), is skipped: it could not have been drawn, so it is not a proposal.
    """
    draws = as_draws(draws)
    vocab = target_probs.shape[-1]
    children = tree_children(parents)
    node, path = -1, []
    while True:
        depth = len(path)
        residual = target_probs[node + 1].double()
        accepted = None
        tried: list[int] = []
        for j, child in enumerate(children.get(node, ())):
            token = draft_token_ids[child]
            if not 0 <= token < vocab:
                continue
            if draft_probs is None:
                proposal = None
                draft_p = 1.0
            else:
                proposal = draft_probs[child].double().clone()
                proposal[tried] = 0.0
                total = float(proposal.sum())
                draft_p = float(proposal[token]) / total if total > 0 else 0.0
                if draft_p <= 0:
                    continue
                proposal /= total
            if draws.uniform(depth, branch=j) <= float(residual[token]) / draft_p:
                accepted = child
                break
            tried.append(token)
            if proposal is None:
                residual = residual.clone()
                residual[token] = 0.0
            else:
                residual = (residual - proposal).clamp_min(0.0)
            total = float(residual.sum())
            if total <= 0:  # only when the test above could not fail: rounding; keep the target's row
                residual = target_probs[node + 1].double()
                total = float(residual.sum())
            residual = residual / total
        if accepted is None:
            return [draft_token_ids[n] for n in path] + [draws.sample(residual, depth)], path
        path.append(accepted)
        node = accepted
