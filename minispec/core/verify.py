"""Verify k draft tokens against the target's k + 1 distributions in one step.

Greedy: accept the longest prefix equal to the target's argmax, then emit the target's own token
at the first mismatch (the correction) or after all k (the bonus token).
Sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023, Alg. 2): accept draft x with
probability min(1, target_probs[x] / draft_probs[x]); at the first rejection draw from the
residual max(0, target_probs - draft_probs), renormalised; if all k pass, draw the bonus token
from the target's last distribution. The emitted tokens then follow the target's law exactly.
Random numbers are the request's ``SeededDraws``, keyed by output position. A draft tree is
verified by minispec/speculation/tree_verify.py.
Invariant: 1 <= emitted <= k + 1, and emitted[:-1] are the accepted drafts in order.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.sampling import SeededDraws, as_draws, logits_to_probs
from minispec.base.tree_shape import is_chain


def request_draws(s: ScheduledRequest) -> SeededDraws:
    """The draws of the request of ``s`` from the output position its first draft would take."""
    return SeededDraws(s.request.seed, s.request.num_output_tokens)


def verify_exact(s: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
    """Verify the chain of drafts of ``s`` so the output keeps the target's law: greedy
    verification for a greedy request, rejection sampling otherwise. target_logits: [k + 1, V]
    float32 (row 0 after the request's last token, row 1 + i after draft i).
    Raises: ValueError for a draft tree (speculation/tree_verify.py verifies those)."""
    drafts, params = s.draft_token_ids, s.request.sampling_params
    if not is_chain(s.draft_parents):
        raise ValueError(f"request {s.request.request_id}: a draft tree goes to tree_verify.verify_tree")
    if params.greedy:
        emitted, accepted = verify_greedy(drafts, target_logits)
    else:
        emitted, accepted = verify_sampled(drafts, s.draft_probs, logits_to_probs(target_logits, params),
                                           request_draws(s))
    return EmittedTokens(emitted, len(drafts), accepted)


def verify_greedy(draft_token_ids: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification of the k proposed ``draft_token_ids`` against ``target_logits``
    [k + 1, V] (row i scores the token after draft i - 1). Returns (emitted tokens: the accepted
    drafts then the correction or bonus token, num_accepted). An id outside [0, V) is a miss."""
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
        draws: the request's ``SeededDraws`` from the first draft's output position, or a
            torch.Generator (or None) drawn from in order.
    Returns: (emitted tokens, num_accepted). A draft id outside [0, V) is rejected, the token
        there drawn from the target's own distribution (the residual of an impossible proposal).
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
