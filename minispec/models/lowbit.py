"""Weights in 4 and 8 bits for PyTorch's own weight-only kernels: fewer bytes read per decode step.

A batch-1 decode reads every weight once, so its time is set by bytes. The bundled checkpoint
ships its projections as GGUF Q4_1: blocks of 32 weights along the input dimension, each stored
as 4-bit codes q in 0..15 with a float16 scale d and minimum m, w = d * q + m (llama.cpp's
ggml-quants, ``block_q4_1``), 20 bytes per 32 weights. PyTorch's CPU kernel
``aten._weight_int4pack_mm_for_cpu`` reads the same form, written w = (q - 8) * scale + zero
with one bfloat16 (scale, zero) pair per group of 32 inputs, so scale = d and zero = m + 8 d:
the file's codes as they are, with d and m rounded to bfloat16.

:func:`quantize_int4` finds each group's codes the way Q4_1 does (round to nearest between the
group's minimum and maximum: d = (max - min) / 15, m = min). On weights that were dequantized
from Q4_1 it gets back the file's own codes (tests/test_lowbit.py checks every projection of
the bundled model against the GGUF file); on float weights it is round-to-nearest 4-bit.
The tied embedding / LM head ships as Q8_0 (int8 codes, a scale per 32); PyTorch's int8 kernel
``aten._weight_int8pack_mm`` takes one scale per output channel, so the head is quantized again
per channel from the file's values (:func:`quantize_int8`).

Both kernels need bfloat16 activations: with float32 ones they fall to scalar code (5-10x
slower), so :func:`int4_linear` and :func:`int8_linear` cast the rows in and the result back.
Taught in notebooks/01_decode_is_memory_bound.ipynb (bytes per token, the ridge moving).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP_SIZE = 32  # inputs sharing one (scale, zero): Q4_1's block, and the kernel's group size
BYTES_PER_WEIGHT = {"int4": 0.5 + 4 / GROUP_SIZE, "int8": 1.0}  # codes + bfloat16 scale and zero per group


@dataclass
class Int4Weight:
    """One [in, out] weight for ``_weight_int4pack_mm_for_cpu``: ``packed`` (the kernel's layout of
    the [out, in] codes), ``scale_zero`` [in / 32, out, 2] bfloat16, ``shape`` (in, out)."""

    packed: torch.Tensor
    scale_zero: torch.Tensor
    shape: tuple[int, int]

    @property
    def num_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scale_zero.numel() * 2


@dataclass
class Int8Weight:
    """One [in, out] weight for ``_weight_int8pack_mm``: ``codes`` [out, in] int8 and ``scales``
    [out] bfloat16 (symmetric, one scale per output channel)."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def num_bytes(self) -> int:
        return self.codes.numel() + self.scales.numel() * 2


def int4_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1's rule on ``weight`` [in, out] float: groups of 32 along ``in``.

    Returns (codes [out, in] int32 in 0..15, d [out, in / 32] float32, m [out, in / 32] float32),
    with weight.T ~= d * codes + m per group. Raises ValueError when ``in`` is not a multiple of 32.
    """
    w = weight.detach().float().T.contiguous()                                   # [out, in]
    if w.shape[1] % GROUP_SIZE:
        raise ValueError(f"int4 weights need an input size divisible by {GROUP_SIZE}; this weight is "
                         f"{tuple(weight.shape)}")
    g = w.view(w.shape[0], -1, GROUP_SIZE)                                       # [out, in / 32, 32]
    lo, hi = g.amin(-1), g.amax(-1)
    d = (hi - lo) / 15
    codes = torch.where(d[..., None] > 0, torch.round((g - lo[..., None]) / d.clamp_min(1e-30)[..., None]), 0)
    return codes.clamp(0, 15).to(torch.int32).view_as(w), d, lo


def _scale_zero(d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Q4_1's (d, m) [out, in / 32] as the kernel's (scale, zero) pairs [in / 32, out, 2] bfloat16."""
    return torch.stack([d.T, (m + 8 * d).T], dim=-1).to(torch.bfloat16).contiguous()


def quantize_int4(weight: torch.Tensor) -> Int4Weight:
    """``weight`` [in, out] as 4-bit codes packed for ``_weight_int4pack_mm_for_cpu`` (see module doc).
    Raises ValueError when ``in`` is not a multiple of 32."""
    codes, d, m = int4_codes(weight)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    return Int4Weight(packed, _scale_zero(d, m), tuple(weight.shape))


def dequantize_int4(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [in, out] weight that :func:`quantize_int4` of ``weight`` multiplies by (codes,
    bfloat16 scale and zero): the reference path's weights for "int4"."""
    codes, d, m = int4_codes(weight)
    sz = _scale_zero(d, m).float()                                               # [in / 32, out, 2]
    scale = sz[..., 0].T.repeat_interleave(GROUP_SIZE, dim=1)                    # [out, in]
    zero = sz[..., 1].T.repeat_interleave(GROUP_SIZE, dim=1)
    return ((codes.float() - 8) * scale + zero).T.contiguous()


def quantize_int8(weight: torch.Tensor, block: int = 4096) -> Int8Weight:
    """``weight`` [in, out] as symmetric int8 with one bfloat16 scale per output channel.

    Works through ``block`` output channels at a time, so its float temporaries stay a few MB: the
    LM head (49,152 channels here) quantized at once made three 113 MB copies and set the peak
    memory of the notebooks that time the formats."""
    w = weight.detach().float().T  # [out, in], a view for float32
    scales = torch.empty(w.shape[0], dtype=torch.bfloat16)
    codes = torch.empty(w.shape, dtype=torch.int8)
    for start in range(0, w.shape[0], block):
        rows, scale = w[start:start + block], scales[start:start + block]
        scale.copy_((rows.abs().amax(dim=1) / 127.0).clamp_min(1e-12))
        codes[start:start + block] = torch.round(rows / scale.float()[:, None]).clamp_(-127, 127)
    return Int8Weight(codes, scales)


def dequantize_int8(w: Int8Weight) -> torch.Tensor:
    """The float32 [in, out] weight an :class:`Int8Weight` stands for."""
    return (w.codes.float() * w.scales.float()[:, None]).T.contiguous()


def int4_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [..., in] @ the int4 weight -> [..., out] in x's dtype (bfloat16 inside the kernel)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16), w.packed, GROUP_SIZE,
                                                     w.scale_zero)
    return out.view(*x.shape[:-1], out.shape[-1]).to(x.dtype)


def int8_linear(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [..., in] @ the int8 weight -> [..., out] in x's dtype (bfloat16 inside the kernel)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16), w.codes, w.scales)
    return out.view(*x.shape[:-1], out.shape[-1]).to(x.dtype)


def check_lowbit(weights: str, device: torch.device) -> None:
    """Raise ValueError when this CPU cannot run ``weights`` ("int4" or "int8") through PyTorch's
    kernels: they need AVX2 or better. (Elsewhere than a CPU the runner multiplies by the
    dequantized weights: the format's numbers, not its bytes.)"""
    if device.type != "cpu":
        return
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX"):
        raise ValueError(f"--weights {weights}: PyTorch's {weights} CPU kernel needs AVX2 or AVX-512 "
                         f"(this CPU reports {capability!r}); use --weights float32 or bfloat16")


def check_int4_widths(hidden_size: int, intermediate_size: int, attention_width: int) -> None:
    """Raise ValueError naming ``--weights int4`` when a projection's input width is not a multiple
    of GROUP_SIZE: the attention and MLP inputs (``hidden_size``), the output projection's
    (``attention_width`` = heads x head_dim) and the down projection's (``intermediate_size``).
    Called on the checkpoint's config before its weights load (minispec/cli/preflight.py)."""
    widths = {"hidden_size": hidden_size, "intermediate_size": intermediate_size,
              "heads x head_dim": attention_width}
    bad = {name: width for name, width in widths.items() if width % GROUP_SIZE}
    if bad:
        named = ", ".join(f"{name} {width}" for name, width in bad.items())
        raise ValueError(f"--weights int4: groups of {GROUP_SIZE} inputs need every projection's input width "
                         f"to be a multiple of {GROUP_SIZE}, and this model's {named} is not; use "
                         "--weights int8, float32 or bfloat16")
