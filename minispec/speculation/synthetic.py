"""The synthetic drafter: acceptance pinned to an acceptance model, for timing studies.

``SyntheticDrafter`` proposes k copies of the request's last token (or a tree's nodes, shaped as
``tree_shape.canonical_tree``) and ``verify_synthetic`` accepts a prefix (or a path) drawn from an
acceptance model (speculation/acceptance.py: alpha per position, per route, or a recorded trace),
whatever the drafts say; the target then samples the token after it. The simulator draws from the
same models, so a seeded run accepts the same prefixes on both clocks. Invariant: the output is
flagged ``synthetic`` (its text is not model output); a draft id outside [0, V) is never accepted.
Taught in notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.sampling import next_tokens
from minispec.speculation.acceptance import FixedAlpha
from minispec.core.drafters import BaseDrafter
from minispec.core.verify import request_draws
from minispec.base.tree_shape import canonical_tree, is_chain, tree_depth


class SyntheticDrafter(BaseDrafter):
    """Proposes k copies of the last token; the verify accepts a prefix drawn from ``acceptance``
    (default: each position with probability alpha), whatever the drafts say.

    Args:
        alpha: per-position acceptance probability, used when ``acceptance`` is None.
        seed: seeds the default acceptance model.
        acceptance: an acceptance model (speculation/acceptance.py), shared in kind with the simulator.
    """

    def __init__(self, alpha: float = 0.6, seed: int = 0, acceptance=None):
        self.acceptance = acceptance if acceptance is not None else FixedAlpha(alpha, seed)

    def propose(self, scheduled) -> None:
        for s in scheduled:
            s.draft_token_ids = [s.request.all_token_ids[-1]] * s.num_draft_tokens
            s.draft_probs = None
            s.draft_parents = None
            if s.is_tree:  # the tree shape the simulator prices
                s.draft_parents = canonical_tree(s.num_speculative_tokens, s.draft_topk, s.num_draft_tokens)

    def verify(self, scheduled, target_logits):
        return verify_synthetic(scheduled, target_logits, self.acceptance)


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
        last = next_tokens(target_logits[row: row + 1], r.sampling_params,
                           request_draws(s).at(len(path))).tolist()
        return EmittedTokens([drafts[n] for n in path] + last, len(drafts), len(path), synthetic=True,
                             accepted_nodes=path, num_speculative_tokens=tree_depth(s.draft_parents))
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
