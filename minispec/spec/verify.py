"""Verify k draft tokens against the target's k + 1 distributions in one step.

Greedy: accept the longest prefix equal to the target's argmax, then emit the target's own token
at the first mismatch (the correction) or after all k (the bonus token).
Sampling: speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2): accept
draft token x with probability min(1, target_probs[x] / draft_probs[x]); on the first rejection
draw from the residual max(0, target_probs - draft_probs), renormalised, with a fresh random
number; if all k pass, draw the bonus token from the target's last distribution. The emitted
tokens are then distributed exactly as if the target had sampled them one by one.
Synthetic: acceptance pinned to an acceptance model (spec/acceptance.py), whatever the drafts
say, for timing studies; the target then samples the token after the accepted prefix, and the
output is flagged as not model text. The simulator draws from the same acceptance models.
A draft id outside [0, V) (a drafter bug) is a rejection: nothing the target cannot emit is
accepted, and the target's own token is drawn there, so the output keeps the target's law.
Random numbers come from the request's ``SeededDraws`` (sampling.py), keyed by output position:
a verify's outcome at a position does not depend on k or on the other requests of the step.
Trees: a drafter may propose several candidates per position (a draft tree: each node's parent
is another node or the request's last token). Greedy: follow the child that equals the target's
argmax from the root down; the first node with no such child emits the target's token. Sampling:
at each node the children are tested one after another by recursive rejection sampling (Jeon et
al. 2024, "Recursive Speculative Decoding", Alg. 1; SpecInfer's multi-round rule, Miao et al.
2024, sec. 4.3, for draws with replacement): child j is accepted with probability
min(1, target_j[x] / draft_j[x]), where draft_j is the draft distribution without the children
already tried (the children are draws without replacement) and target_j the residual left by
the earlier rejections, max(0, target_{j-1} - draft_{j-1}) renormalised; if every child is
rejected the target's token is drawn from the last residual. A deterministic drafter's child is
a point mass (its residual just drops that token), so a duplicate child is rejected for free.
The emitted tokens keep the target's distribution exactly. A chain uses the functions above.
Invariant: 1 <= emitted <= depth + 1, and emitted[:-1] are the accepted drafts in order.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.batch import EmittedTokens, ScheduledRequest
from minispec.sampling import SeededDraws, as_draws, logits_to_probs, next_tokens
from minispec.spec.acceptance import tree_depth


def request_draws(s: ScheduledRequest) -> SeededDraws:
    """The draws of the request of ``s`` from the output position its first draft would take."""
    return SeededDraws(s.request.seed, s.request.num_output_tokens)


def verify_exact(s: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
    """Verify the drafts of ``s`` so the output keeps the target's law: greedy verification for a
    greedy request, rejection sampling otherwise; a draft tree by the tree rules above.
    target_logits: [len(drafts) + 1, V] float32 (row 0 after the request's last token, row 1 + i
    after draft i)."""
    drafts, params = s.draft_token_ids, s.request.sampling_params
    if not is_chain(s.draft_parents):
        if params.greedy:
            emitted, path = verify_tree_greedy(drafts, s.draft_parents, target_logits)
        else:
            emitted, path = verify_tree_sampled(drafts, s.draft_parents, s.draft_probs,
                                                logits_to_probs(target_logits, params), request_draws(s))
        return EmittedTokens(emitted, len(drafts), len(path), accepted_nodes=path, draft_depth=tree_depth(s.draft_parents))
    if params.greedy:
        emitted, accepted = verify_greedy(drafts, target_logits)
    else:
        emitted, accepted = verify_sampled(drafts, s.draft_probs, logits_to_probs(target_logits, params),
                                           request_draws(s))
    return EmittedTokens(emitted, len(drafts), accepted)


def verify_synthetic(s: ScheduledRequest, target_logits: torch.Tensor, acceptance) -> EmittedTokens:
    """Accept a prefix drawn from ``acceptance`` (an acceptance model's ``draw(request, k)``), then
    sample the target's token at the first rejected position (or the bonus position).
    target_logits: [k + 1, V] float32."""
    drafts, r = s.draft_token_ids, s.request
    if not is_chain(s.draft_parents):  # a tree: the path drawn through it (acceptance.draw_tree)
        path = acceptance.draw_tree(r, s.draft_parents)
        vocab = target_logits.shape[-1]
        path = path[: next((i for i, n in enumerate(path) if not 0 <= drafts[n] < vocab), len(path))]
        row = 0 if not path else 1 + path[-1]
        last = next_tokens(target_logits[row: row + 1], r.sampling_params, request_draws(s).at(len(path))).tolist()
        return EmittedTokens([drafts[n] for n in path] + last, len(drafts), len(path), synthetic=True,
                             accepted_nodes=path, draft_depth=tree_depth(s.draft_parents))
    accepted = min(acceptance.draw(r, len(drafts)), _num_valid(drafts, target_logits.shape[-1]))
    last = next_tokens(target_logits[accepted: accepted + 1], r.sampling_params,
                       request_draws(s).at(accepted)).tolist()
    return EmittedTokens(drafts[:accepted] + last, len(drafts), accepted, synthetic=True)


def _num_valid(draft_token_ids: list[int], vocab_size: int) -> int:
    """How many drafts come before the first id outside [0, vocab_size)."""
    for i, token in enumerate(draft_token_ids):
        if not 0 <= token < vocab_size:
            return i
    return len(draft_token_ids)


def verify_greedy(draft_token_ids: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification.

    Args:
        draft_token_ids: the k proposed tokens.
        target_logits: [k + 1, V], row i scores the token after draft position i - 1.
    Returns: (emitted tokens: accepted drafts then the correction or bonus token, num_accepted).
    An id outside [0, V) never equals the target's argmax, so it is rejected like any other miss.
    """
    target_ids = target_logits.argmax(dim=-1).tolist()
    num_accepted = 0
    for draft, target in zip(draft_token_ids, target_ids):
        if draft != target:
            break
        num_accepted += 1
    return draft_token_ids[:num_accepted] + [target_ids[num_accepted]], num_accepted


def verify_sampled(draft_token_ids: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                   draws) -> tuple[list[int], int]:
    """Rejection-sampling verification (Leviathan et al. 2023, Alg. 1).

    Args:
        draft_token_ids: the k proposed tokens.
        draft_probs: [k, V] the distributions the drafts were drawn from, or None for a
            deterministic drafter (n-gram), which proposes with probability 1.
        target_probs: [k + 1, V] the target's processed distributions.
        draws: the request's ``SeededDraws`` from the first draft's output position (position i
            draws its accept test, its residual and the bonus from its own keyed numbers), or a
            torch.Generator (or None) drawn from in order.
    Returns: (emitted tokens, num_accepted). A draft id outside [0, V) is rejected: the emitted
        token there is drawn from the target's own distribution, which is exactly the residual of a
        proposal the target can never make, so the output keeps the target's law.
    """
    draws = as_draws(draws)
    vocab = target_probs.shape[-1]
    for i, draft in enumerate(draft_token_ids):
        if not 0 <= draft < vocab:
            return list(draft_token_ids[:i]) + [draws.sample(target_probs[i], i)], i
        draft_p = 1.0 if draft_probs is None else float(draft_probs[i, draft])
        target_p = float(target_probs[i, draft])
        if not (draft_p > 0 and draws.uniform(i) <= target_p / draft_p):
            # rejected: draw from the residual max(0, target - draft), renormalised
            residual = target_probs[i].clone()
            if draft_probs is None:
                residual[draft] = 0.0
            else:
                residual = (residual - draft_probs[i]).clamp_min(0.0)
            if float(residual.sum()) <= 0:
                residual = target_probs[i]
            return list(draft_token_ids[:i]) + [draws.sample(residual, i)], i
    k = len(draft_token_ids)
    return list(draft_token_ids) + [draws.sample(target_probs[k], k)], k


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

