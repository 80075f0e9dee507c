"""The roofline cost model against hand-computed cases, plus the hardware and model spec files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minispec.core.request import Request, SamplingParams
from minispec.core.batch import Batch, ScheduledRequest
from minispec.cost.model import CostModel, expected_accepted_length, leviathan_speedup
from minispec.cost.hardware import HARDWARE_DIR, HardwareSpec, available_hardware, load_hardware
from minispec.cost.modelspec import ModelSpec, available_models, load_model_spec

# L=2, E=8, I=16, H=2, Hkv=1, D=4, V=32, untied, bf16:
#   layer matmuls: E(H+2Hkv)D + HDE + 3EI = 128 + 64 + 384 = 576 per layer, 1152 for two
#   LM head: E V = 256; weights read per step: (1152 + 256) x 2 bytes = 2816
#   KV per token: 2 L Hkv D x 2 bytes = 32; embedding row: E x 2 = 16 bytes
#   FLOPs: 2 x 1152 = 2304 per token, 2 x 256 = 512 per logit row, 4 L H D = 64 per (query, key) pair
TOY = ModelSpec(name="toy", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1, head_dim=4,
                vocab_size=32)


def hw(flops: float, bandwidth: float, **kw) -> HardwareSpec:
    return HardwareSpec("test", "test device", flops, bandwidth, 1e12, compute_efficiency=1.0,
                        bandwidth_efficiency=1.0, **kw)


def test_toy_counts_by_hand():
    assert TOY.num_layer_params == 1152
    assert TOY.weight_bytes_per_step == 2816
    assert TOY.kv_bytes_per_token == 32
    assert TOY.num_params == 32 * 8 + 1152 + 256 + 5 * 8  # embedding, layers, head, norms


def test_memory_bound_decode_by_hand():
    # one decode (q = 1) on 10 cached tokens, one logit row
    cost = CostModel(hw(1e12, 1e9), TOY).items_cost([(1, 10, 1)])
    assert cost.flops == 2304 + 512 + 64 * (10 + 1)          # 3520
    assert cost.bytes == 2816 + 16 + 32 * 11                  # 3184
    assert cost.bound == "memory"
    assert cost.time_s == pytest.approx(3184 / 1e9, rel=1e-12)


def test_compute_bound_prefill_by_hand():
    # a 100-token prompt chunk from position 0: pairs = 100 x 101 / 2 = 5050, one logit row
    cost = CostModel(hw(1e6, 1e12), TOY).items_cost([(100, 0, 1)])
    assert cost.flops == 2304 * 100 + 512 + 64 * 5050         # 554112
    assert cost.bytes == 2816 + 16 * 100 + 32 * 100
    assert cost.bound == "compute"
    assert cost.time_s == pytest.approx(0.554112, rel=1e-12)


def test_overheads_and_efficiency_add_up():
    base = CostModel(hw(1e12, 1e9), TOY).items_cost([(1, 10, 1), (1, 20, 1)]).time_s
    spec = HardwareSpec("t", "t", 1e12, 1e9, 1e12, compute_efficiency=1.0, bandwidth_efficiency=0.5,
                        step_overhead_s=1e-3, request_overhead_s=1e-4)
    slow = CostModel(spec, TOY).items_cost([(1, 10, 1), (1, 20, 1)]).time_s
    assert slow == pytest.approx(2 * base + 1e-3 + 2e-4, rel=1e-12)


def test_cpu_knobs_by_hand():
    # compute 1e-6 s, memory 2e-6 s for one decode on 10 cached tokens (toy numbers above)
    flops, nbytes = 2304 + 512 + 64 * 11, 3184
    cpu = HardwareSpec("cpu", "cpu", flops / 1e-6, nbytes / 2e-6, 1e12, compute_efficiency=1.0,
                       bandwidth_efficiency=1.0, overlap=0.0)
    assert CostModel(cpu, TOY).items_cost([(1, 10, 1)]).time_s == pytest.approx(3e-6)  # no overlap: a sum
    half = HardwareSpec("cpu", "cpu", 1e15, 1e9, 1e12, compute_efficiency=1.0, bandwidth_efficiency=1.0,
                        attention_efficiency=0.5, extra_weight_reads=1.0)
    one, two = CostModel(half, TOY).items_cost([(1, 10, 1)]), CostModel(half, TOY).items_cost([(2, 10, 2)])
    assert one.bytes == 3184                                   # a one-row forward reads the weights once
    assert two.bytes == 2 * 2816 + 2 * 16 + 32 * 12            # a two-row forward packs them: twice
    slow_attention = CostModel(HardwareSpec("c", "c", 1e6, 1e15, 1e12, compute_efficiency=1.0,
                                            bandwidth_efficiency=1.0, attention_efficiency=0.5), TOY)
    assert slow_attention.items_cost([(1, 10, 1)]).compute_s == pytest.approx((2304 + 512 + 2 * 64 * 11) / 1e6)


def test_quantized_weights_read_fewer_bytes():
    bf16 = CostModel(hw(1e15, 1e9), TOY).items_cost([(1, 0, 1)])
    int4 = CostModel(hw(1e15, 1e9), TOY.with_dtypes("int4", "bfloat16")).items_cost([(1, 0, 1)])
    assert bf16.bytes - int4.bytes == pytest.approx(2816 * (1 - 0.25) + 16 * (1 - 0.25))
    assert int4.time_s < bf16.time_s


def test_batch_cost_reads_a_scheduler_batch():
    decode = Request("d", [1] * 10, SamplingParams(), 0.0)
    decode.output_token_ids, decode.num_computed_tokens = [5], 10
    verify = Request("v", [1] * 20, SamplingParams(), 0.0)
    verify.output_token_ids, verify.num_computed_tokens = [5], 20
    chunk = Request("c", [1] * 50, SamplingParams(), 0.0)
    batch = Batch([ScheduledRequest(decode, 1), ScheduledRequest(verify, 1, 3, draft_token_ids=[0, 0, 0]),
                   ScheduledRequest(chunk, 30, is_prefill=True)])
    cm = CostModel(hw(1e12, 1e9), TOY)
    # decode: q=1, r=1; verify: q=4 on 20, r=4; mid-prompt chunk: q=30 on 0, r=0
    assert cm.batch_cost(batch) == cm.items_cost([(1, 10, 1), (4, 20, 4), (30, 0, 0)])
    assert cm.batch_cost(batch).num_tokens == batch.num_tokens == 35


def test_draft_loop_is_k_forwards():
    draft = TOY.with_dtypes("bfloat16")
    cm = CostModel(hw(1e12, 1e9, step_overhead_s=1e-5), TOY, draft)
    # two requests, k = 2 and 1: forward 0 runs both (pending 3 and 1), forward 1 runs the first only
    got = cm.draft_time_s([3, 1], [10, 40], [2, 1])
    f0 = cm.items_cost([(3, 10, 1), (1, 40, 1)], draft=True).time_s
    f1 = cm.items_cost([(1, 13, 1)], draft=True).time_s
    assert got == pytest.approx(f0 + f1, rel=1e-12)
    assert CostModel(hw(1e12, 1e9), TOY).draft_time_s([1], [10], [4]) == 0.0  # free drafting


def test_draft_kv_window_caps_draft_context():
    cm = CostModel(hw(1e12, 1e9), TOY, TOY, draft_kv_window=64)
    full = CostModel(hw(1e12, 1e9), TOY, TOY)
    assert cm.draft_time_s([1], [32000], [4]) < full.draft_time_s([1], [32000], [4]) / 10
    assert cm.draft_time_s([1], [10], [4]) == full.draft_time_s([1], [10], [4])


def test_uniform_decode_matches_general_form():
    cm = CostModel(load_hardware("h100"), load_model_spec("llama-3-8b"), load_model_spec("llama-3.2-1b"))
    for n, c, k in ((1, 100, 0), (8, 500, 4), (64, 2000, 3)):
        assert cm.uniform_decode_time_s(n, c, k) == pytest.approx(cm.decode_step_time_s([c] * n, [k] * n))


def test_leviathan_formulas():
    assert expected_accepted_length(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert expected_accepted_length(1.0, 4) == 5
    assert expected_accepted_length(0.0, 4) == 1
    assert leviathan_speedup(0.8, 4, 0.0) == pytest.approx(expected_accepted_length(0.8, 4))
    assert leviathan_speedup(0.8, 4, 0.25) == pytest.approx(3.3616 / 2.0)


def test_decode_is_memory_bound_and_crosses_over_on_h100():
    cm = CostModel(load_hardware("h100"), load_model_spec("llama-3-8b"))
    small = cm.forward_cost(1, 1, 1001, 1001, 1)
    assert small.bound == "memory"
    assert cm.forward_cost(4096, 1, 4096 * 4097 / 2, 4096, 1).bound == "compute"    # a 4k-token prefill
    assert cm.forward_cost(512, 512, 512 * 101, 512 * 101, 512).bound == "compute"  # 512 short decodes
    assert cm.forward_cost(512, 512, 512 * 8001, 512 * 8001, 512).bound == "memory"  # ... at 8k context


def test_every_hardware_number_has_a_source_and_is_dense():
    names = available_hardware()
    for required in ("h100", "h200", "a100-80gb", "l4", "rtx4090"):
        assert required in names
    for name in names:
        data = json.loads((HARDWARE_DIR / f"{name}.json").read_text())
        for key in ("dense_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_bytes", "compute_efficiency",
                    "bandwidth_efficiency", "step_overhead_s", "request_overhead_s", "overlap", "attention_efficiency",
                    "extra_weight_reads"):
            assert data["sources"].get(key), f"{name}: {key} has no source"
    # dense, not the sparsity figure: H100 SXM is 989 TFLOPS dense bf16 (1979 sparse)
    assert load_hardware("h100").dense_flops_per_s == pytest.approx(989.4e12)
    assert load_hardware("a100-80gb").dense_flops_per_s == pytest.approx(312e12)


def test_presets_have_real_parameter_counts():
    expect = {"llama-3-8b": 8.03e9, "llama-3.2-1b": 1.236e9, "llama-3-70b": 70.55e9, "qwen2.5-0.5b": 0.494e9,
              "qwen2.5-7b": 7.62e9, "smollm2-135m": 134.5e6, "smollm2-360m": 361.8e6, "smollm2-1.7b": 1.711e9}
    for name, params in expect.items():
        assert load_model_spec(name).num_params == pytest.approx(params, rel=0.01), name
    draft = load_model_spec("smollm2-135m-draft")
    shipped = json.loads((Path(__file__).resolve().parents[1] / "data" / "draft" / "draft_config.json").read_text())
    cfg = shipped["model_config"]  # the preset has the shipped draft's shape
    assert (draft.num_layers, draft.hidden_size, draft.num_heads, draft.num_kv_heads, draft.head_dim,
            draft.intermediate_size, draft.num_lm_head_rows) == (
        cfg["num_layers"], cfg["hidden_size"], cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"],
        cfg["intermediate_size"], cfg["vocab_size"])
    assert set(expect) | {"smollm2-135m-draft"} <= set(available_models())


def test_spec_from_transformers_config_and_minispec_config():
    from transformers import LlamaConfig

    from minispec.models.config import ModelConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5)
    from_obj = ModelSpec.from_hf_config(cfg, name="Llama-3-8B")
    assert from_obj == load_model_spec("llama-3-8b")
    mine = ModelConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                       num_kv_heads=2, head_dim=8, tie_word_embeddings=True, qkv_bias=True)
    assert ModelSpec.of(mine).num_params == mine.num_params
    fp8, bf16 = load_model_spec("llama-3-8b", "fp8"), load_model_spec("llama-3-8b")
    assert fp8.weight_bytes == pytest.approx(bf16.weight_bytes / 2)


def test_bad_names_and_values_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="hardware 'tpu9' is unknown"):
        load_hardware("tpu9")
    with pytest.raises(ValueError, match="has no preset"):
        load_model_spec("gpt-7")
    with pytest.raises(ValueError, match="dtype 'fp3' is unknown"):
        load_model_spec("llama-3-8b", "fp3")
    with pytest.raises(ValueError, match="compute_efficiency"):
        HardwareSpec("x", "x", 1.0, 1.0, 1.0, compute_efficiency=1.5)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "description": "x", "dense_flops_per_s": 1,
                               "memory_bandwidth_bytes_per_s": 1, "memory_bytes": 1, "tflops": 3}))
    with pytest.raises(ValueError, match="unknown field"):
        load_hardware(str(bad))
