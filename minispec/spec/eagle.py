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

    def start(self, s):
        """Catch up on the target features seen since the last proposal: the head runs positions
        done..n-2 (feature f_p with token x_{p+1}); it needs the target's f_{n-2}. Returns (the
        catch-up ForwardItem, those features [T, F]) or (None, None) to decode plainly (no features
        yet, an id the head cannot embed, a full pool)."""
        r, cached = s.request, self.progress.num_cached
        n, rid = r.num_tokens, r.request_id
        s.draft_token_ids, s.draft_parents, s.draft_probs = [], None, None
        first, rows = self.features.get(rid, (0, []))
        held = torch.cat(rows) if rows else None
        done = min(cached.get(rid, 0), n - 2)
        ok = held is not None and first <= done and first + len(held) >= n - 1 and self.can_embed(r, done + 1)
        if not ok or not self.block_manager.allocate(rid, n + self.scratch(s)):
            return None, None
        cached[rid] = done
        return ForwardItem(rid, r.all_token_ids[done + 1: n], done, 1), held[done - first: n - 1 - first]

    def scratch_base(self, s) -> int:
        """Head position n - 2 holds (f_{n-2}, x_{n-1}), the last committed one."""
        return s.request.num_tokens - 1

    def node_item(self, s, tree, nodes):
        """A node's input is its token with the head's own predicted feature from its parent's row
        (Li et al. 2024, sec. 3.1: later draft steps feed back the head's features)."""
        item, _ = super().node_item(s, tree, nodes)
        parents = [tree.nodes[n].parent for n in nodes]
        return item, torch.cat([tree.root_hidden if p < 0 else tree.nodes[p].extra["hidden"] for p in parents])

    def run(self, items, extras, first: bool):
        # the first forward reads the target's features, later ones the head's own predictions
        return self.runner.forward(items, **{"target_features" if first else "features": torch.cat(extras)})

    def finish(self, s, tree) -> None:
        """True-feature positions 0..n-2 are consumed and final; the predicted ones (chain or tree)
        are rebuilt next time, from the features the verify step is about to produce."""
        n, rid = s.request.num_tokens, s.request.request_id
        self.progress.num_cached[rid] = n - 1
        self.features[rid] = (n - 1, [])

    def free(self, request_ids) -> None:
        for rid in request_ids:
            self.features.pop(rid, None)
        super().free(request_ids)
