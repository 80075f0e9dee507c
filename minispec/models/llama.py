"""A compact Llama-family decoder in plain PyTorch that runs one packed step.

Llama (Touvron et al. 2023): RMSNorm (Zhang & Sennrich 2019), rotary position embeddings
(Su et al. 2021), grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP (Shazeer 2020).
Weights are stored [in, out] and fused (one QKV matrix, one gate/up matrix): at batch 1 a decode
step is one matrix-vector product per weight, and on CPU the [in, out] layout streams faster.
How each product runs (the plain reference, oneDNN, int8) is the runner's choice: see kernels.py.
Invariant: the forward is a pure function of (tokens, positions, cache contents); the KV cache is
written by slot, so a rejected draft token's K/V is simply overwritten later (as in gpt-fast).
Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.models.config import ModelConfig
from minispec.models.kernels import PreparedLinear, PreparedWeights, linear


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as the reference implementation does. x [..., E].

    ``F.rms_norm`` is weight * x * rsqrt(mean(x^2) + eps) in one call, bit-identical to spelling it
    out in float32. In lower precision the normalisation runs in float32 and the weight is applied
    after the cast back, as transformers does.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


# attend(layer index, q [N, H, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, H, D]: how a layer's
# queries read keys and values. The ModelRunner's writes this step's K/V into its paged cache and
# reads each request's context (minispec/core/attention.py); the dense reference path is causal SDPA.
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Reference causal attention without a cache: q [B, T, H, D], k/v [B, T, Hkv, D] -> [B, T, H, D]."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, scale=scale, enable_gqa=q.shape[2] != k.shape[2])
    return o.transpose(1, 2)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/D), [D/2] float32 on CPU (Su et al. 2021, eq. 15). The device is
    explicit: under a ``torch.device("meta")`` context torch would route arange through its
    Python reference ops, which import the compiler stack (2.6 s at every start)."""
    steps = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device="cpu")
    return 1.0 / (cfg.rope_theta ** (steps / cfg.head_dim))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, heads, D] by per-token cos/sin [N, 1, D] (rotate-half convention).

    Rotate-half pairs dimension i with i + D/2: out = x * cos + cat(-x2, x1) * sin. ``signed_sin``
    is sin with its first half negated (see :meth:`LlamaModel.rope`), so cat(-x2, x1) * sin is
    roll(x, D/2) * signed_sin: one op instead of four, and the same numbers bit for bit.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class DecoderLayer(nn.Module):
    """Pre-norm attention block then pre-norm SwiGLU MLP, each with a residual connection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        e, d = cfg.hidden_size, cfg.head_dim
        self.cfg = cfg
        self.input_norm = nn.Parameter(torch.ones(e))
        # [E, (H+2Hkv)D]
        self.qkv_proj = nn.Parameter(torch.empty(e, (cfg.num_heads + 2 * cfg.num_kv_heads) * d))
        self.qkv_bias = nn.Parameter(torch.zeros(self.qkv_proj.shape[1])) if cfg.qkv_bias else None
        self.o_proj = nn.Parameter(torch.empty(cfg.num_heads * d, e))                            # [HD, E]
        self.post_norm = nn.Parameter(torch.ones(e))
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * cfg.intermediate_size))             # [E, 2I]
        self.down_proj = nn.Parameter(torch.empty(cfg.intermediate_size, e))                     # [I, E]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                prepared: dict[str, PreparedLinear | None] | None = None) -> torch.Tensor:
        """x [..., E] -> [..., E]; ``attend(q, k, v)`` maps [..., H|Hkv, D] to [..., H, D];
        ``prepared``: this layer's four weights made ready for the runner's kernels
        (minispec/models/kernels.py), or None for the plain product."""
        cfg, prep = self.cfg, prepared or {}
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = linear(rms_norm(x, self.input_norm, cfg.rms_norm_eps), self.qkv_proj, prep.get("qkv_proj"))
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        qk, v = qkv.split([(h + hkv) * d, hkv * d], dim=-1)
        qk = apply_rope(qk.unflatten(-1, (h + hkv, d)), cos, sin)  # one call rotates q and k heads
        q, k = qk.split([h, hkv], dim=-2)
        o = attend(q, k, v.unflatten(-1, (hkv, d)))
        x = x + linear(o.flatten(-2), self.o_proj, prep.get("o_proj"))
        gate_up = linear(rms_norm(x, self.post_norm, cfg.rms_norm_eps), self.gate_up_proj,
                         prep.get("gate_up_proj"))
        gate, up = gate_up.chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.down_proj, prep.get("down_proj"))


class LlamaModel(nn.Module):
    """The decoder: embedding, L layers, final norm, LM head ([E, V], a copy when tied)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))  # [V, E]
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Parameter(torch.empty(cfg.hidden_size, cfg.vocab_size))        # [E, V]
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)
        self.attention_scaling = 1.0  # > 1 only for scaled RoPE variants set by the loader
        self.scale = cfg.head_dim ** -0.5

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for positions [...] -> [..., 1, D] in the model's dtype.

        The sin has its first half negated, as :func:`apply_rope` expects; both are computed once
        per step and shared by every layer.
        """
        freqs = positions.float()[..., None] * self.inv_freq                           # [..., D/2]
        dtype = self.embed_tokens.dtype
        cos = (torch.cat((freqs, freqs), dim=-1).cos() * self.attention_scaling).to(dtype)
        sin = (freqs.sin() * self.attention_scaling).to(dtype)
        return cos.unsqueeze(-2), torch.cat((-sin, sin), dim=-1).unsqueeze(-2)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend,
                prepared: PreparedWeights | None = None, capture: tuple[int, ...] = ()) -> torch.Tensor:
        """One packed step of N tokens from any number of requests.

        Args:
            input_ids: [N] long; positions: [N] long (each token's position in its sequence).
            attend: how layer i attends (the runner's paged KV cache; see ``Attend``).
            prepared: the runner's weights for its kernels (minispec/models/kernels.py), or None
                for the plain ``x @ W`` reference path.
            capture: layer ids whose outputs an EAGLE-3 style head also reads (``features``).
        Returns: hidden states [N, E] after the final norm; use :meth:`compute_logits` on the rows
            that need them. With ``capture``, [N, (len(capture) + 1) E]: see :meth:`features`.
        """
        x = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rope(positions)
        taken = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, lambda q, k, v, i=i: attend(i, q, k, v),
                      prepared.layers[i] if prepared else None)
            if i in capture:
                taken.append(x)
        return self.features(taken, rms_norm(x, self.norm, self.cfg.rms_norm_eps))

    def features(self, taken: list[torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
        """What a multi-layer draft head reads (EAGLE-3, Li et al. 2025, section 3): the captured
        layer outputs [..., E] each, RMS-normalised without a weight so that no layer's scale
        dominates, then the final hidden state ``hidden`` [..., E], concatenated: [..., (C + 1) E].
        The last E columns are always the final hidden state. With nothing captured: ``hidden``."""
        if not taken:
            return hidden
        eps = self.cfg.rms_norm_eps
        return torch.cat([F.rms_norm(t.float(), (t.shape[-1],), eps=eps).to(hidden.dtype) for t in taken]
                         + [hidden], dim=-1)

    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reference path without a cache (tests, distillation): input_ids [B, T] -> logits [B, T, V]."""
        return self.compute_logits(self.hidden_dense(input_ids))

    def hidden_dense(self, input_ids: torch.Tensor, capture: tuple[int, ...] = ()) -> torch.Tensor:
        """input_ids [B, T] -> hidden states [B, T, E] after the final norm, without a cache; with
        ``capture``, [B, T, (len(capture) + 1) E] as :meth:`features` builds them."""
        x = F.embedding(input_ids, self.embed_tokens)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        cos, sin = self.rope(positions)
        taken = []
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, lambda q, k, v: dense_causal_attention(q, k, v, self.scale))
            if i in capture:
                taken.append(x)
        return self.features(taken, rms_norm(x, self.norm, self.cfg.rms_norm_eps))

    def compute_logits(self, hidden: torch.Tensor, prepared: PreparedWeights | None = None) -> torch.Tensor:
        """hidden [M, E] -> logits [M, V] in float32 (``prepared``: as in :meth:`forward`)."""
        return linear(hidden, self.lm_head, prepared.lm_head if prepared else None).float()

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> "LlamaModel":
        """A model with random weights of the given shape (tests, and timing real shapes that are
        not on disk). Allocated on ``device`` without a CPU copy, so an 8B shape fits a GPU."""
        with torch.device("meta"):
            model = cls(cfg)
        model = model.to_empty(device=device)
        g = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.normal_(0.0, 1.0, generator=g)
                if "norm" in name:
                    p.mul_(0.1).add_(1.0)
                else:
                    p.mul_(p.shape[0] ** -0.5 if p.dim() == 2 else 0.02)
            if cfg.tie_word_embeddings:
                model.lm_head.copy_(model.embed_tokens.T)
        model.inv_freq = rope_inv_freq(cfg).to(device)  # to_empty() left the buffer uninitialised
        return model.to(dtype)
