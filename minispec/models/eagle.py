"""The EAGLE draft head as a model: one decoder layer over the target's features and the next token.

EAGLE (Li et al. 2024, section 3): at position t the head reads the target's feature f_t (its final
hidden state) together with the embedding of the token x_{t+1} that was actually chosen, and
predicts the next feature f_{t+1}; the target's own LM head (here only the columns of a reduced
vocabulary, FR-Spec) turns that into a draft distribution for x_{t+2}. Drafting with it (catch-up,
rollback, feeding back its own features) is minispec/speculation/eagle.py.
With ``feature_layers`` the head reads more of the target than its last state (EAGLE-3, Li et al.
2025, section 3): the outputs of a few lower target layers, RMS-normalised, beside the final hidden
state, projected back to width E by ``fc3`` before the first draft step; later steps still read the
head's own predictions. ``fc3`` starts as [0; ...; 0; I], so a new multi-layer head first computes
exactly what a last-state head with the same weights computes.
Invariant: the embedding and LM-head columns are the target's own, frozen; only fc (and fc3), the
layer and the final norm train. Taught in notebooks/04_speculative_decoding.ipynb.
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

    def __init__(self, cfg, feature_layers: tuple[int, ...] = ()):
        super().__init__(cfg)
        e = cfg.hidden_size
        self.fc = nn.Parameter(torch.empty(2 * e, e))  # [2E, E]
        # target layers read besides the final hidden state (EAGLE-3); () reads the final state only
        self.feature_layers = tuple(feature_layers)
        self.feature_size = (len(self.feature_layers) + 1) * e  # width of the target features read, F
        if self.feature_layers:
            self.fc3 = nn.Parameter(torch.empty(self.feature_size, e))  # [F, E]
        # prepared for the runner's kernels besides the layer and the LM head
        self.EXTRA_LINEAR = ("fc", "fc3") if self.feature_layers else ("fc",)

    def project(self, target_features: torch.Tensor, prepared: PreparedWeights | None = None) -> torch.Tensor:
        """The target's features [..., F] (``LlamaModel.features`` with ``feature_layers`` captured)
        -> the head's feature input [..., E]: fc3 for a multi-layer head, unchanged otherwise.
        Raises: ValueError for another width than F."""
        if target_features.shape[-1] != self.feature_size:
            raise ValueError(f"target features of width {target_features.shape[-1]}: this head reads "
                             f"{self.feature_size} (target layers {list(self.feature_layers)} and the "
                             "final state)")
        if not self.feature_layers:
            return target_features
        return linear(target_features.to(self.fc.dtype), self.fc3,
                      prepared.extra.get("fc3") if prepared else None)

    def fuse(self, input_ids: torch.Tensor, features: torch.Tensor,
             prepared: PreparedWeights | None = None) -> torch.Tensor:
        """input_ids [...] long and features [..., E] -> the layer's input [..., E]."""
        x = F.embedding(input_ids, self.embed_tokens)
        return linear(torch.cat([x, features.to(x.dtype)], dim=-1), self.fc,
                      prepared.extra.get("fc") if prepared else None)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                prepared: PreparedWeights | None = None, features: torch.Tensor | None = None,
                target_features: torch.Tensor | None = None) -> torch.Tensor:
        """One packed step through the head's paged cache (see LlamaModel.forward).

        Args: as LlamaModel.forward, plus exactly one of: features [N, E], the head's own predicted
            feature of each token's previous position, or target_features [N, F], the target's
            (``project`` maps them to width E).
        Returns: predicted features [N, E]; ``compute_logits`` gives the draft logits.
        Raises: ValueError without features or with both kinds, and as ``project``.
        """
        if (features is None) == (target_features is None):
            raise ValueError("an EAGLE head needs either the target's features or its own with "
                             "its input tokens")
        if target_features is not None:
            features = self.project(target_features, prepared)
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
        [B, T, F] (at t) -> predicted features [B, T, E] (of f_{t+1}). Raises: ValueError without
        features, and as ``project``."""
        if features is None:
            raise ValueError("an EAGLE head needs the target's features with its input tokens")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        cos, sin = self.rope(positions)
        return self.out_norm(self.layers[0](self.fuse(input_ids, self.project(features)), cos, sin,
                                            lambda q, k, v: dense_causal_attention(q, k, v, self.scale)))

    def forward_dense(self, input_ids: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """As hidden_dense, then the draft logits [B, T, V_draft] float32."""
        return self.compute_logits(self.hidden_dense(input_ids, features))


def check_feature_layers(cfg, feature_layers) -> tuple[int, ...]:
    """``feature_layers`` as a tuple of ints after checking them against the target's config.
    Raises: ValueError unless they are increasing layer ids below the target's last layer (whose
    output, after the final norm, is always read)."""
    layers = tuple(int(i) for i in feature_layers)
    if any(not 0 <= i < cfg.num_layers - 1 for i in layers) or list(layers) != sorted(set(layers)):
        raise ValueError(f"feature layers {list(layers)}: must be increasing target layer ids in "
                         f"0..{cfg.num_layers - 2} (the final hidden state is always read)")
    return layers


def build_eagle(target: LlamaModel, vocab_map: torch.Tensor, init_layer: int | None = None,
                feature_layers: tuple[int, ...] = ()) -> EagleDraft:
    """A float32 EAGLE head for ``target``: its layer starts as a copy of target layer ``init_layer``
    (default the last), fc as [0; I] (it starts by reading the feature alone); with
    ``feature_layers`` (target layer ids, increasing, below the last) also fc3 as [0; ...; 0; I]
    (it starts by reading the final hidden state alone).

    Raises: ValueError for a layer id or vocab_map id outside the target, or feature layers that are
    not increasing ids below the last layer.
    """
    cfg = target.cfg
    init_layer = cfg.num_layers - 1 if init_layer is None else init_layer
    if not 0 <= init_layer < cfg.num_layers:
        raise ValueError(f"init layer {init_layer}: must be in 0..{cfg.num_layers - 1}")
    feature_layers = check_feature_layers(cfg, feature_layers)
    if vocab_map.numel() == 0 or int(vocab_map.min()) < 0 or int(vocab_map.max()) >= cfg.vocab_size:
        raise ValueError(f"vocab_map must hold target token ids in 0..{cfg.vocab_size - 1}")
    head_cfg = replace(cfg, num_layers=1, vocab_size=int(vocab_map.numel()), tie_word_embeddings=False)
    with torch.device("meta"):
        head = EagleDraft(head_cfg, feature_layers)
    head = head.to_empty(device="cpu").float()
    e = cfg.hidden_size
    with torch.no_grad():
        head.layers[0].load_state_dict({k: v.float()
                                        for k, v in target.layers[init_layer].state_dict().items()})
        head.fc.copy_(torch.cat([torch.zeros(e, e), torch.eye(e)]))
        if feature_layers:
            head.fc3.copy_(torch.cat([torch.zeros(len(feature_layers) * e, e), torch.eye(e)]))
        head.norm.copy_(target.norm.float())
    head.embed_tokens = nn.Parameter(target.embed_tokens.detach().float(), requires_grad=False)
    head.lm_head = nn.Parameter(target.lm_head.detach().float()[:, vocab_map].contiguous(),
                                requires_grad=False)
    head.inv_freq = target.inv_freq.clone()
    head.attention_scaling = target.attention_scaling
    return head
