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
Invariant: 1 <= emitted <= k + 1, and emitted[:-1] == draft_token_ids[:num_accepted].
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.batch import EmittedTokens, ScheduledRequest
from minispec.sampling import SeededDraws, as_draws, logits_to_probs, next_tokens


def request_draws(s: ScheduledRequest) -> SeededDraws:
    """The draws of the request of ``s`` from the output position its first draft would take."""
    return SeededDraws(s.request.seed, s.request.num_output_tokens)


def verify_exact(s: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
    """Verify the drafts of ``s`` so the output keeps the target's law: greedy verification for a
    greedy request, rejection sampling otherwise. target_logits: [k + 1, V] float32."""
    drafts, params = s.draft_token_ids, s.request.sampling_params
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
