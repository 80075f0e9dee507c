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
Invariant: 1 <= emitted <= k + 1, and emitted[:-1] == draft_token_ids[:num_accepted].
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.batch import EmittedTokens, ScheduledRequest
from minispec.sampling import logits_to_probs, next_tokens


def verify_exact(s: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
    """Verify the drafts of ``s`` so the output keeps the target's law: greedy verification for a
    greedy request, rejection sampling otherwise. target_logits: [k + 1, V] float32."""
    drafts, params = s.draft_token_ids, s.request.sampling_params
    if params.greedy:
        emitted, accepted = verify_greedy(drafts, target_logits)
    else:
        emitted, accepted = verify_sampled(drafts, s.draft_probs, logits_to_probs(target_logits, params),
                                           s.request.generator)
    return EmittedTokens(emitted, len(drafts), accepted)


def verify_synthetic(s: ScheduledRequest, target_logits: torch.Tensor, acceptance) -> EmittedTokens:
    """Accept a prefix drawn from ``acceptance`` (an acceptance model's ``draw(request, k)``), then
    sample the target's token at the first rejected position (or the bonus position).
    target_logits: [k + 1, V] float32."""
    drafts, r = s.draft_token_ids, s.request
    accepted = acceptance.draw(r, len(drafts))
    last = next_tokens(target_logits[accepted: accepted + 1], r.sampling_params, r.generator).tolist()
    return EmittedTokens(drafts[:accepted] + last, len(drafts), accepted, synthetic=True)


def verify_greedy(draft_token_ids: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy verification.

    Args:
        draft_token_ids: the k proposed tokens.
        target_logits: [k + 1, V], row i scores the token after draft position i - 1.
    Returns: (emitted tokens: accepted drafts then the correction or bonus token, num_accepted).
    """
    target_ids = target_logits.argmax(dim=-1).tolist()
    num_accepted = 0
    for draft, target in zip(draft_token_ids, target_ids):
        if draft != target:
            break
        num_accepted += 1
    return draft_token_ids[:num_accepted] + [target_ids[num_accepted]], num_accepted


def verify_sampled(draft_token_ids: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                   generator: torch.Generator | None) -> tuple[list[int], int]:
    """Rejection-sampling verification (Leviathan et al. 2023, Alg. 1).

    Args:
        draft_token_ids: the k proposed tokens.
        draft_probs: [k, V] the distributions the drafts were drawn from, or None for a
            deterministic drafter (n-gram), which proposes with probability 1.
        target_probs: [k + 1, V] the target's processed distributions.
        generator: the request's generator (per-request seeds stay reproducible).
    Returns: (emitted tokens, num_accepted).
    """
    k = len(draft_token_ids)
    drafts = torch.tensor(draft_token_ids, dtype=torch.long)
    if draft_probs is None:
        draft_probs = torch.zeros(k, target_probs.shape[-1])
        draft_probs[torch.arange(k), drafts] = 1.0
    rows = torch.arange(k)
    ratio = target_probs[rows, drafts] / draft_probs[rows, drafts]
    accept_draw = torch.rand(k, generator=generator)
    for i in range(k):
        if accept_draw[i] >= ratio[i]:
            residual = (target_probs[i] - draft_probs[i]).clamp_min(0.0)
            total = residual.sum()
            residual = residual / total if total > 0 else target_probs[i]
            token = int(torch.multinomial(residual, 1, generator=generator))
            return draft_token_ids[:i] + [token], i
    bonus = int(torch.multinomial(target_probs[k], 1, generator=generator))
    return list(draft_token_ids) + [bonus], k
