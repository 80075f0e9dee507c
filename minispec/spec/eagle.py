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
target's verify step has produced the true features (that is the rollback). The target's
features live beside its K/V (``KVCache.features``, written by slot in every target forward), so
whatever holds for the target's K/V holds for them: only committed positions count, a tree's
accepted path is moved into place with its K/V, and a prefix-cache hit brings the features of the
cached positions with their K/V (the head, whose own cache is not shared, catches up on them in
its first proposal). A head with ``feature_layers`` (EAGLE-3, Li et al. 2025) reads those target
layers' outputs too, because the engine's target runner captures them (minispec/build.py).
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
                 confidence_threshold: float = 0.0, target=None):
        super().__init__(runner, target_vocab_size, vocab_map, confidence_threshold)
        self.target = target  # the target's ModelRunner, whose KVCache keeps the features read here

    def start(self, s):
        """Catch up on the target features of the positions the head has not run: it runs
        positions done..n-2 (feature f_p with token x_{p+1}), read from the target's cache, where
        every committed position's features are. Returns (the catch-up ForwardItem, those
        features [T, F]) or (None, None) to decode plainly (an id the head cannot embed, a full pool)."""
        r, cached = s.request, self.progress.num_cached
        n, rid = r.num_tokens, r.request_id
        s.draft_token_ids, s.draft_parents, s.draft_probs = [], None, None
        done = min(cached.get(rid, 0), n - 2)
        if n < 2 or not self.can_embed(r, done + 1) or not self.block_manager.allocate(rid, n + self.scratch(s)):
            return None, None
        cached[rid] = done
        return ForwardItem(rid, r.all_token_ids[done + 1: n], done, 1), self.target.read_features(rid, done, n - 1)

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
        self.progress.num_cached[s.request.request_id] = s.request.num_tokens - 1
