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
target's verify step has produced the true features (that is the rollback). The head declares the
target features it reads (``feature_channel``: a ``speculation.features.FeatureChannel``); the builder
gives it a ``FeatureStore`` over the target's slots, which it fills as it observes each step
(the features of the tokens the target kept), so only committed positions count and a
prefix-cache hit brings the cached positions' features with their K/V (the head, whose own cache
is not shared, catches up on them in its first proposal). A head with ``feature_layers``
(EAGLE-3, Li et al. 2025) reads those target layers' outputs too.
The head itself (``EagleDraft``, ``build_eagle``) is a model: minispec/models/eagle.py.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.model_runner import ForwardItem
from minispec.speculation.features import FeatureChannel, FeatureStore
from minispec.speculation.tree_drafters import TreeDraftModelDrafter


class EagleDrafter(TreeDraftModelDrafter):
    """Drafts with an EagleDraft: catch up on the target features seen since the last proposal,
    then k single-token steps (or a tree's depths) feeding back the head's own features (Li et al.
    2024, section 3.1).

    Args: as TreeDraftModelDrafter; ``runner.model`` must be an EagleDraft; ``features``: the
        store the target's features are kept in (``feature_channel`` says its width).
    """

    def __init__(self, runner, target_vocab_size: int, vocab_map: torch.Tensor | None = None,
                 confidence_threshold: float = 0.0, features: FeatureStore | None = None,
                 max_catch_up_tokens: int | None = None, mask_logits=None):
        super().__init__(runner, target_vocab_size, vocab_map, confidence_threshold, max_catch_up_tokens,
                         mask_logits)
        self.features = features

    @staticmethod
    def feature_channel(head) -> FeatureChannel:
        """The target features ``head`` (an EagleDraft) reads per position: its width F and the
        target layers captured besides the final state."""
        return FeatureChannel(head.feature_size, tuple(head.feature_layers))

    def propose(self, scheduled) -> None:
        """Chains and trees alike through the tree loop (a chain is the tree of topk 1): every
        forward of the head takes features, the target's or its own."""
        self.propose_trees(scheduled)

    def catch_up(self, s):
        """Catch up on the target features of the positions the head has not run: it runs
        positions done..n-2 (feature f_p with token x_{p+1}), read from the feature store, where
        every committed position's features are, or a chunk of them when the step's catch-up
        budget runs out (``DraftProgress.grant``; the request then drafts nothing this step).
        Returns (the catch-up ForwardItem, those features [T, F]) or (None, None) to decode
        plainly (an id the head cannot embed, a full pool, no budget left)."""
        r, progress = s.request, self.progress
        n, rid = r.num_tokens, r.request_id
        s.draft_token_ids, s.draft_parents, s.draft_probs = [], None, None
        if n < 2:
            return None, None
        # true-feature positions count once their forward ran (``propose``); predicted ones are rebuilt
        done, m = progress.begin(r, n - 1)
        tokens = r.all_token_ids[done + 1:]
        if ((tokens and max(tokens) >= self.num_embeddings)
                or not self.block_manager.allocate(rid, n + self.scratch_positions(s))):
            progress.rollback(r)  # the grant comes back
            return None, None
        s.num_catch_up_tokens = m
        if not m:
            return None, None
        return (ForwardItem(rid, r.all_token_ids[done + 1: done + 1 + m], done, int(done + m == n - 1)),
                self.features.read(rid, done, done + m))

    def scratch_base(self, s) -> int:
        """Head position n - 2 holds (f_{n-2}, x_{n-1}), the last committed one."""
        return s.request.num_tokens - 1

    def run(self, items, inputs, first: bool):
        """The first forward reads the target's features; a draft token's input is its token with
        the head's own predicted feature from the row that drafted it (Li et al. 2024, sec. 3.1)."""
        if first:
            return self.runner.forward(items, target_features=torch.cat(inputs))
        return self.runner.forward(items, features=torch.cat([torch.cat(rows) for rows in inputs]))

    def after_drafting(self, s, num_run: int) -> None:
        """Nothing to count: ``catch_up`` counted the true-feature positions it ran; the predicted ones
        (chain or tree) are rebuilt next time, from the features the verify step is about to produce."""

    def observe(self, scheduled, outputs, hidden) -> None:
        """Keep the target's features of the tokens it kept this step (``hidden``: per request the
        rows of its own tokens, then of its drafts, a tree's accepted path only) at the positions
        they hold, then roll the head's K/V back as a draft model does."""
        for s, out, features in zip(scheduled, outputs, hidden):
            kept = features[: s.num_own_tokens + out.num_draft_accepted]
            self.features.write(s.request.request_id, s.request.num_computed_tokens, kept)
        super().observe(scheduled, outputs, hidden)
