"""The EAGLE draft head as a model: one decoder layer over the target's features and the next token.

EAGLE (Li et al. 2024, section 3): at position t the head reads the target's feature f_t (its final
hidden state) together with the embedding of the token x_{t+1} that was actually chosen, and
predicts the next feature f_{t+1}; the target's own LM head (here only the columns of a reduced
vocabulary, FR-Spec) turns that into a draft distribution for x_{t+2}. Drafting with it (catch-up,
rollback, feeding back its own features) is minispec/spec/eagle.py.
Invariant: the embedding and LM-head columns are the target's own, frozen; only the fc, the layer
and the final norm train. Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.models.kernels import PreparedWeights, linear
from minispec.models.llama import Attend, LlamaModel, dense_causal_attention, rms_norm


class EagleDraft(LlamaModel):
    """fc over [embedding(x_{t+1}), f_t], one decoder layer, a final RMSNorm, the target's LM-head columns.

    ``cfg.num_layers`` is 1 and ``cfg.vocab_size`` the draft vocabulary V_draft; ``embed_tokens``
    keeps all V_target rows of the target's embedding (the head reads target ids) and ``lm_head``
    [E, V_draft] holds the target's columns ``vocab_map``. Both are frozen and not shipped.
    """

    EXTRA_LINEAR = ("fc",)  # prepared for the runner's kernels besides the layer and the LM head

    def __init__(self, cfg):
        super().__init__(cfg)
        self.fc = nn.Parameter(torch.empty(2 * cfg.hidden_size, cfg.hidden_size))  # [2E, E]

    def fuse(self, input_ids: torch.Tensor, features: torch.Tensor,
             prepared: PreparedWeights | None = None) -> torch.Tensor:
        """input_ids [...] long and features [..., E] -> the layer's input [..., E]."""
        x = F.embedding(input_ids, self.embed_tokens)
        return linear(torch.cat([x, features.to(x.dtype)], dim=-1), self.fc, prepared.extra.get("fc") if prepared else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                prepared: PreparedWeights | None = None, features: torch.Tensor | None = None) -> torch.Tensor:
        """One packed step through the head's paged cache (see LlamaModel.forward).

        Args: as LlamaModel.forward, plus features [N, E]: the feature of each token's previous
            position (the target's, or the head's own prediction).
        Returns: predicted features [N, E]; ``compute_logits`` gives the draft logits.
        Raises: ValueError without features.
        """
        if features is None:
            raise ValueError("an EAGLE head needs the target's features with its input tokens")
        x = self.fuse(input_ids, features, prepared)
        cos, sin = self.rope(positions)
        layer = prepared.layers[0] if prepared else None
        return self.out_norm(self.layers[0](x, cos, sin, lambda q, k, v: attend(0, q, k, v), layer))

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
