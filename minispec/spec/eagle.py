"""An EAGLE draft head: one decoder layer that drafts from the target's own hidden states.

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
reach the drafter through ``observe`` after every target forward, for every scheduled request.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.attention import dense_causal_attention, paged_attention, write_kv
from minispec.models.llama import LlamaModel, linear, rms_norm
from minispec.spec.drafters import DraftModelDrafter


class EagleDraft(LlamaModel):
    """fc over [embedding(x_{t+1}), f_t], one decoder layer, a final RMSNorm, the target's LM-head columns.

    ``cfg.num_layers`` is 1 and ``cfg.vocab_size`` the draft vocabulary V_draft; ``embed_tokens``
    keeps all V_target rows of the target's embedding (the head reads target ids) and ``lm_head``
    [E, V_draft] holds the target's columns ``vocab_map``. Both are frozen and not shipped.
    """

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fc = nn.Parameter(torch.empty(2 * cfg.hidden_size, cfg.hidden_size))  # [2E, E]

    def fuse(self, input_ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """input_ids [...] long and features [..., E] -> the layer's input [..., E]."""
        x = F.embedding(input_ids, self.embed_tokens)
        return linear(torch.cat([x, features.to(x.dtype)], dim=-1), self.fc)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_k: torch.Tensor,
                kv_v: torch.Tensor, meta, features: torch.Tensor | None = None) -> torch.Tensor:
        """One packed step through the head's paged cache (see LlamaModel.forward).

        Args: as LlamaModel.forward, plus features [N, E]: the feature of each token's previous
            position (the target's, or the head's own prediction).
        Returns: predicted features [N, E]; ``compute_logits`` gives the draft logits.
        Raises: ValueError without features.
        """
        if features is None:
            raise ValueError("an EAGLE head needs the target's features with its input tokens")
        x = self.fuse(input_ids, features)
        cos, sin = self.rope(positions)

        def attend(q, k, v):
            write_kv(k, v, kv_k[0], kv_v[0], meta.slot_mapping)
            return paged_attention(q, kv_k[0], kv_v[0], meta, self.scale)
        return self.out_norm(self.layers[0](x, cos, sin, attend))

    def out_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output [..., E] -> a predicted feature, normalised as the target's are (its
        final RMSNorm, here trainable): the same scale as the features it is fed back with."""
        return rms_norm(x, self.norm, self.cfg.rms_norm_eps)


    def hidden_dense(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """Reference path without a cache: input_ids [B, T] (x_{t+1} at t) and the target's features
        [B, T, E] (f_t at t) -> predicted features [B, T, E] (of f_{t+1}). Raises: ValueError without
        features."""
        if features is None:
            raise ValueError("an EAGLE head needs the target's features with its input tokens")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        cos, sin = self.rope(positions)
        return self.out_norm(self.layers[0](self.fuse(input_ids, features), cos, sin,
                                            lambda q, k, v: dense_causal_attention(q, k, v, self.scale)))

    def forward_dense(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """As hidden_dense, then the draft logits [B, T, V_draft] float32."""
        return self.compute_logits(self.hidden_dense(input_ids, features))


def build_eagle(target: LlamaModel, vocab_map: torch.Tensor, init_layer: int | None = None) -> EagleDraft:
    """A float32 EAGLE head for ``target``: its layer starts as a copy of target layer ``init_layer``
    (default the last), fc as [0; I] (it starts by reading the feature alone).

    Raises: ValueError for a layer id or vocab_map id outside the target.
    """
    cfg = target.cfg
    init_layer = cfg.num_layers - 1 if init_layer is None else init_layer
    if not 0 <= init_layer < cfg.num_layers:
        raise ValueError(f"init layer {init_layer}: must be in 0..{cfg.num_layers - 1}")
    if vocab_map.numel() == 0 or int(vocab_map.min()) < 0 or int(vocab_map.max()) >= cfg.vocab_size:
        raise ValueError(f"vocab_map must hold target token ids in 0..{cfg.vocab_size - 1}")
    head_cfg = replace(cfg, num_layers=1, vocab_size=int(vocab_map.numel()), tie_word_embeddings=False)
    with torch.device("meta"):
        head = EagleDraft(head_cfg)
    head = head.to_empty(device="cpu").float()
    e = cfg.hidden_size
    with torch.no_grad():
        head.layers[0].load_state_dict({k: v.float() for k, v in target.layers[init_layer].state_dict().items()})
        head.fc.copy_(torch.cat([torch.zeros(e, e), torch.eye(e)]))
        head.norm.copy_(target.norm.float())
    head.embed_tokens = nn.Parameter(target.embed_tokens.detach().float(), requires_grad=False)
    head.lm_head = nn.Parameter(target.lm_head.detach().float()[:, vocab_map].contiguous(), requires_grad=False)
    head.inv_freq = target.inv_freq.clone()
    head.attention_scaling = target.attention_scaling
    return head


class EagleDrafter(DraftModelDrafter):
    """Drafts with an EagleDraft: catch up on the target features seen since the last proposal,
    then k single-token steps feeding back the head's own features (Li et al. 2024, section 3.1).

    Args: as DraftModelDrafter; ``runner.model`` must be an EagleDraft.
    """

    reads_target_hidden = True  # the executor passes target hidden states to ``observe``

    def __init__(self, runner, target_vocab_size: int, vocab_map: torch.Tensor | None = None):
        super().__init__(runner, target_vocab_size, vocab_map)
        self.features: dict[str, tuple[int, list[torch.Tensor]]] = {}  # rid -> (first position, rows)

    def observe(self, scheduled, hidden: list[torch.Tensor], outputs) -> None:
        """Keep the target features of the tokens each request keeps after this step.

        Args: the step's ScheduledRequests, per request the target's hidden states [T, E] of the
            tokens it fed (its new tokens, then its drafts), and the step's SeqOutputs.
        """
        for s, h, out in zip(scheduled, hidden, outputs):
            rid, start = s.request.request_id, s.request.num_computed_tokens
            first, rows = self.features.get(rid, (start, []))
            held = sum(len(x) for x in rows)
            if start != first + held:  # recomputed from an earlier position: restart the record
                first, rows = start, []
            # a copy: a view would keep the whole step's hidden tensor alive
            rows.append(h[: s.num_new_tokens + out.num_accepted].clone())
            self.features[rid] = (first, rows)

    def propose(self, scheduled) -> None:
        from minispec.executor import ForwardItem

        bm = self.block_manager
        live = []
        for s in scheduled:
            r = s.request
            n = r.num_tokens
            first, rows = self.features.get(r.request_id, (0, []))
            held = torch.cat(rows) if rows else None
            # the head runs positions done..n-2 (feature f_p with token x_{p+1}); it needs f_{n-2}
            done = min(self.num_computed.get(r.request_id, 0), n - 2)
            ok = held is not None and first <= done and first + len(held) >= n - 1
            if not ok or not bm.allocate(r.request_id, n + s.num_spec_tokens - 1):
                s.draft_token_ids, s.draft_probs = [], None  # no features yet or pool full: decode plainly
                continue
            self.num_computed[r.request_id] = done
            s.draft_token_ids, s.draft_probs = [], []
            live.append((s, held[done - first: n - 1 - first]))
        last_feature = {}
        for step in range(max((s.num_spec_tokens for s, _ in live), default=0)):
            active = [(s, f) for s, f in live if len(s.draft_token_ids) < s.num_spec_tokens]
            items = []
            for s, catch_up in active:
                r, rid = s.request, s.request.request_id
                if step == 0:
                    items.append(ForwardItem(rid, r.all_token_ids[self.num_computed[rid] + 1: r.num_tokens],
                                             self.num_computed[rid], 1, catch_up))
                else:
                    items.append(ForwardItem(rid, s.draft_token_ids[-1:], r.num_tokens - 2 + step, 1,
                                             last_feature[rid]))
            logits_list, hidden_list = self.runner.forward(items, return_hidden=True)
            for (s, _), logits, h in zip(active, logits_list, hidden_list):
                last_feature[s.request.request_id] = h[-1:]
                self.append_draft(s, logits)
        for s, _ in live:
            # true-feature positions 0..n-2 are consumed and final; the predicted ones are rebuilt
            # next time, from the features the verify step is about to produce (position n-1 on)
            n = s.request.num_tokens
            self.num_computed[s.request.request_id] = n - 1
            self.features[s.request.request_id] = (n - 1, [])
            s.draft_probs = torch.stack(s.draft_probs) if s.draft_probs else None

    def free(self, request_ids) -> None:
        for rid in request_ids:
            self.features.pop(rid, None)
        super().free(request_ids)
