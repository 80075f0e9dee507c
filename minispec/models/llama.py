"""A compact Llama-family decoder in plain PyTorch that runs one packed step.

Llama (Touvron et al. 2023): RMSNorm (Zhang & Sennrich 2019), rotary position embeddings
(Su et al. 2021), grouped-query attention (Ainslie et al. 2023) and a SwiGLU MLP (Shazeer 2020).
Weights are stored [in, out] and fused (one QKV matrix, one gate/up matrix): at batch 1 a decode
step is one matrix-vector product per weight, and on CPU the [in, out] layout streams faster.
Invariant: the forward is a pure function of (tokens, positions, cache contents); the KV cache is
written by slot, so a rejected draft token's K/V is simply overwritten later (as in gpt-fast).
Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from minispec.attention import AttentionMetadata, dense_causal_attention, paged_attention, write_kv


@dataclass
class ModelConfig:
    """Shape of a Llama-family model (read from a transformers config by ``from_hf_config``)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2-style bias on the Q, K and V projections

    @classmethod
    def from_hf_config(cls, cfg) -> "ModelConfig":
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        heads = cfg.num_attention_heads
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
            num_heads=heads, num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            rope_theta=float(theta), rms_norm_eps=cfg.rms_norm_eps,
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            qkv_bias=getattr(cfg, "model_type", "") == "qwen2",
        )

    @property
    def num_params(self) -> int:
        """Parameters, counting a tied embedding once."""
        e, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = (e + self.qkv_bias) * (self.num_heads + 2 * self.num_kv_heads) * d + self.num_heads * d * e
        layer = attn + 3 * e * i + 2 * e
        head = 0 if self.tie_word_embeddings else self.vocab_size * e
        return self.vocab_size * e + self.num_layers * layer + e + head


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, as the reference implementation does. x [..., E].

    ``F.rms_norm`` is weight * x * rsqrt(mean(x^2) + eps) in one call, bit-identical to spelling it
    out in float32. In lower precision the normalisation runs in float32 and the weight is applied
    after the cast back, as transformers does.
    """
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight [in, out] -> [..., out].

    One row (a batch-1 decode) goes through :func:`split_matvec`. ``packed`` is the same weight
    pre-packed for oneDNN by :meth:`LlamaModel.pack_weights` (a CPU speed-up behind
    ``EngineConfig.packed_weights``): on the 2-core AMD EPYC the course was measured on, the BLAS
    call behind ``@`` (MKL) multiplies 2 to 32 rows 2-3x slower than oneDNN's blocked kernel, so a
    (k + 1)-token verify cost 2-3 decodes instead of about one, as the memory-bound picture says
    it should (bench/README.md). The packed product agrees to float32 rounding, not bit for bit.
    """
    if x.numel() == x.shape[-1]:
        return split_matvec(x, weight)
    if packed is None:
        return x @ weight
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def split_matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One row x [..., in] times weight [in, out], split over the CPU threads: the same as x @ weight.

    MKL computes a matrix-vector product on one core, so a batch-1 decode streams the weights at
    one core's bandwidth. Viewed as P column blocks ([P, in, out/P], a view: no copy), the same
    product is a batched matmul that torch runs one block per thread, so all P cores stream their
    share; each output column is the same dot product as before (bit for bit with the MKL build the
    course was measured on). On the 2-core course machine this read weights 30-40% faster in the
    perf helper's measurement; bench/compare_hf.py measures the batch-1 decode it serves.
    """
    parts, n = torch.get_num_threads(), weight.shape[-1]
    if parts < 2 or n % parts or x.device.type != "cpu" or not weight.is_contiguous():
        return x @ weight
    blocks = weight.view(weight.shape[0], parts, n // parts).transpose(0, 1)       # [P, in, out/P]
    out = torch.bmm(x.reshape(1, 1, -1).expand(parts, 1, -1), blocks)              # [P, 1, out/P]
    return out.reshape(*x.shape[:-1], n)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/D), [D/2] float32 (Su et al. 2021, eq. 15)."""
    return 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))


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
        self.qkv_proj = nn.Parameter(torch.empty(e, (cfg.num_heads + 2 * cfg.num_kv_heads) * d))  # [E, (H+2Hkv)D]
        self.qkv_bias = nn.Parameter(torch.zeros(self.qkv_proj.shape[1])) if cfg.qkv_bias else None
        self.o_proj = nn.Parameter(torch.empty(cfg.num_heads * d, e))                            # [HD, E]
        self.post_norm = nn.Parameter(torch.ones(e))
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * cfg.intermediate_size))             # [E, 2I]
        self.down_proj = nn.Parameter(torch.empty(cfg.intermediate_size, e))                     # [I, E]
        self.packed: dict[str, torch.Tensor] = {}  # oneDNN copies of the four weights, see pack_weights

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """x [..., E] -> [..., E]; ``attend(q, k, v)`` maps [..., H|Hkv, D] to [..., H, D]."""
        cfg, packed = self.cfg, self.packed
        h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qkv = linear(rms_norm(x, self.input_norm, cfg.rms_norm_eps), self.qkv_proj, packed.get("qkv_proj"))
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        qk, v = qkv.split([(h + hkv) * d, hkv * d], dim=-1)
        qk = apply_rope(qk.unflatten(-1, (h + hkv, d)), cos, sin)  # one call rotates q and k heads
        q, k = qk.split([h, hkv], dim=-2)
        o = attend(q, k, v.unflatten(-1, (hkv, d)))
        x = x + linear(o.flatten(-2), self.o_proj, packed.get("o_proj"))
        gate_up = linear(rms_norm(x, self.post_norm, cfg.rms_norm_eps), self.gate_up_proj, packed.get("gate_up_proj"))
        gate, up = gate_up.chunk(2, dim=-1)
        return x + linear(F.silu(gate) * up, self.down_proj, packed.get("down_proj"))


class LlamaModel(nn.Module):
    """The decoder: embedding, L layers, final norm, LM head ([E, V], a copy when tied)."""

    PACKED = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # per-layer weights pack_weights copies

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
        self.packed_lm_head: torch.Tensor | None = None  # oneDNN copy of lm_head, see pack_weights

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

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_k: torch.Tensor,
                kv_v: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """One packed step through the paged cache.

        Args:
            input_ids: [N] long; positions: [N] long (each token's position in its sequence).
            kv_k, kv_v: [L, num_blocks, block_size, Hkv, D] cache tensors (written in place).
            meta: slot mapping and attention groups for the step.
        Returns: hidden states [N, E] after the final norm; use :meth:`compute_logits` on the rows
            that need them.
        """
        x = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rope(positions)
        for layer, k_cache, v_cache in zip(self.layers, kv_k, kv_v):
            def attend(q, k, v, k_cache=k_cache, v_cache=v_cache):
                write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
                return paged_attention(q, k_cache, v_cache, meta, self.scale)
            x = layer(x, cos, sin, attend)
        return rms_norm(x, self.norm, self.cfg.rms_norm_eps)

    def forward_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Reference path without a cache (tests, distillation): input_ids [B, T] -> logits [B, T, V]."""
        return self.compute_logits(self.hidden_dense(input_ids))

    def hidden_dense(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [B, T] -> hidden states [B, T, E] after the final norm, without a cache."""
        x = F.embedding(input_ids, self.embed_tokens)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        cos, sin = self.rope(positions)
        for layer in self.layers:
            x = layer(x, cos, sin, lambda q, k, v: dense_causal_attention(q, k, v, self.scale))
        return rms_norm(x, self.norm, self.cfg.rms_norm_eps)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, E] -> logits [M, V] in float32."""
        return linear(hidden, self.lm_head, self.packed_lm_head).float()

    @torch.no_grad()
    def pack_weights(self, enable: bool = True) -> "LlamaModel":
        """Keep a oneDNN pre-packed copy of every projection and of the LM head (CPU speed-up).

        The plain [in, out] weights stay the reference; the packed copies cost as much memory again
        and are what :func:`linear` uses for two rows or more (one row takes :func:`split_matvec`). ``build_engine`` calls this with
        ``EngineConfig.packed_weights``; the copies live on the model, so engines sharing one model
        share the setting of the last one built. Pack after the weights, dtype and device are final:
        later changes to the weights are not seen (``pack_weights(False)`` drops the copies, and
        packing an already packed model keeps its copies). Returns the model.
        Raises: ValueError off CPU, or when this torch build has no oneDNN (mkldnn).
        """
        if not enable:
            for layer in self.layers:
                layer.packed = {}
            self.packed_lm_head = None
            return self
        if self.packed_lm_head is not None and self.packed_lm_head.dtype == self.lm_head.dtype:
            return self
        if self.lm_head.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            raise ValueError(f"packed weights need a CPU device and a torch built with oneDNN (mkldnn); this "
                             f"model is on {self.lm_head.device} and mkldnn available="
                             f"{torch.backends.mkldnn.is_available()}: turn packed_weights off")

        def pack(weight: torch.Tensor) -> torch.Tensor:
            # oneDNN takes the [out, in] layout; 16 is the row count its blocking is tuned for
            return torch.ops.mkldnn._reorder_linear_weight(weight.T.contiguous(), 16)

        for layer in self.layers:
            layer.packed = {name: pack(getattr(layer, name)) for name in self.PACKED}
        self.packed_lm_head = pack(self.lm_head)
        return self

    @classmethod
    def random(cls, cfg: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32) -> "LlamaModel":
        """A model with random weights of the given shape (tests, timing with real shapes)."""
        g = torch.Generator().manual_seed(seed)
        model = cls(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * (p.shape[0] ** -0.5 if p.dim() == 2 else 0.02))
            if cfg.tie_word_embeddings:
                model.lm_head.copy_(model.embed_tokens.T)
        return model.to(dtype)
