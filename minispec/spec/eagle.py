"""Drafting with an EAGLE head: one decoder layer that drafts from the target's own hidden states.

A standalone draft model must rebuild from tokens alone what the target has already worked out.
EAGLE (Li et al. 2024, section 3) gives the draft the target's last hidden state instead: at
position t the head reads the target's feature f_t (its final hidden state, the row the LM head
turns into the distribution of token t + 1) together with the embedding of the token x_{t+1} that
was actually chosen, and predicts the next feature f_{t+1}; the target's own LM head (here only
the columns of a reduced vocabulary, FR-Spec) turns that into a draft distribution for x_{t+2}.
For the second and later draft tokens the head feeds back its own predicted feature.

Invariant: draft KV position t holds (f_t, x_{t+1}). Positions built from true target features
are kept; positions built from predicted features are rebuilt by the next proposal, once the
target's verify step has produced the true features (that is the rollback). The target's features
reach the drafter through ``observe`` after every target forward, for every scheduled request; a
head with ``feature_layers`` (EAGLE-3, Li et al. 2025) also gets those target layers' outputs
there, because the engine's target runner captures them (minispec/build.py).
The head itself (``EagleDraft``, ``build_eagle``) is a model: minispec/models/eagle.py.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.model_runner import ForwardItem
from minispec.spec.drafters import DraftModelDrafter


class EagleDrafter(DraftModelDrafter):
    """Drafts with an EagleDraft: catch up on the target features seen since the last proposal,
    then k single-token steps feeding back the head's own features (Li et al. 2024, section 3.1).

    Args: as DraftModelDrafter; ``runner.model`` must be an EagleDraft.
    """

    def __init__(self, runner, target_vocab_size: int, vocab_map: torch.Tensor | None = None,
                 confidence_threshold: float = 0.0):
        super().__init__(runner, target_vocab_size, vocab_map, confidence_threshold)
        self.features: dict[str, tuple[int, list[torch.Tensor]]] = {}  # rid -> (first position, rows)

    def observe(self, scheduled, outputs, hidden: list[torch.Tensor]) -> None:
        """Keep the target features of the tokens each request keeps after this step.

        Args: the step's ScheduledRequests, its EmittedTokens, and per request the target's
            features [T, F] of the tokens it fed (its own tokens, then its drafts): its final hidden
            states, and for a multi-layer head the captured layers' outputs before them
            (``ForwardOutput.features``).
        """
        for s, h, out in zip(scheduled, hidden, outputs):
            rid, start = s.request.request_id, s.request.num_computed_tokens
            first, rows = self.features.get(rid, (start, []))
            held = sum(len(x) for x in rows)
            if start != first + held:  # recomputed from an earlier position: restart the record
                first, rows = start, []
            # a copy: a view would keep the whole step's hidden tensor alive
            rows.append(h[: s.num_own_tokens + out.num_accepted].clone())
            self.features[rid] = (first, rows)
        super().observe(scheduled, outputs, hidden)

    def propose(self, scheduled) -> None:
        bm, cached = self.block_manager, self.progress.num_cached
        live = []
        for s in scheduled:
            r = s.request
            n = r.num_tokens
            first, rows = self.features.get(r.request_id, (0, []))
            held = torch.cat(rows) if rows else None
            # the head runs positions done..n-2 (feature f_p with token x_{p+1}); it needs f_{n-2}
            done = min(cached.get(r.request_id, 0), n - 2)
            ok = held is not None and first <= done and first + len(held) >= n - 1 and self.can_embed(r, done + 1)
            if not ok or not bm.allocate(r.request_id, n + s.num_speculative_tokens - 1):
                # no features yet, an id the head cannot embed, or a full pool: decode plainly
                s.draft_token_ids, s.draft_probs = [], None
                continue
            cached[r.request_id] = done
            s.draft_token_ids, s.draft_probs = [], []
            live.append((s, held[done - first: n - 1 - first]))
        last_feature = {}
        for step in range(max((s.num_speculative_tokens for s, _ in live), default=0)):
            # still drafting: fewer than k so far, and no token fell below the confidence threshold
            active = [(s, f) for s, f in live if len(s.draft_token_ids) == step < s.num_speculative_tokens]
            if not active:
                break
            items, features = [], []
            for s, catch_up in active:
                r, rid = s.request, s.request.request_id
                if step == 0:
                    items.append(ForwardItem(rid, r.all_token_ids[cached[rid] + 1: r.num_tokens], cached[rid], 1))
                    features.append(catch_up)
                else:
                    items.append(ForwardItem(rid, s.draft_token_ids[-1:], r.num_tokens - 2 + step, 1))
                    features.append(last_feature[rid])
            # the first step reads the target's features, later ones the head's own predictions
            kind = "target_features" if step == 0 else "features"
            forward = self.runner.forward(items, **{kind: torch.cat(features)})
            for (s, _), logits, h in zip(active, forward.logits, forward.hidden):
                last_feature[s.request.request_id] = h[-1:]
                self.append_draft(s, logits)
        for s, _ in live:
            # true-feature positions 0..n-2 are consumed and final; the predicted ones are rebuilt
            # next time, from the features the verify step is about to produce (position n-1 on)
            n = s.request.num_tokens
            cached[s.request.request_id] = n - 1
            self.features[s.request.request_id] = (n - 1, [])
            s.draft_probs = torch.stack(s.draft_probs) if s.draft_probs else None

    def free(self, request_ids) -> None:
        for rid in request_ids:
            self.features.pop(rid, None)
        super().free(request_ids)
