"""Drafters as engines run them (heads sized from the target, free lookups), acceptance from a
mean accepted length, engine modes and tensor parallelism in the cost model."""

from __future__ import annotations

import json

import pytest

from minispec.cli import main
from minispec.sim import CostModel, HardwareSpec, load_hardware, load_model_spec, sweep
from minispec.sim.drafters import head_spec, resolve_drafter
from minispec.sim.executor import kv_budget_bytes
from minispec.speculation.acceptance import alpha_for_accepted_length, expected_accepted_length, expected_tree_length
from minispec.base.tree_shape import canonical_tree


def test_heads_are_sized_from_the_target_by_hand():
    target = load_model_spec("llama-3.1-8b")
    e, qkv_out, i = 4096, (32 + 2 * 8) * 128, 14336
    layer = e * qkv_out + 32 * 128 * e + 3 * e * i
    eagle3 = head_spec("eagle3-head", target)
    # one layer, fc 3E -> E and Q/K/V over a 2E input, an LM head over 32,000 draft tokens
    assert eagle3.weight_bytes_per_step == 2 * (layer + 3 * e * e + e * qkv_out + 32000 * e)
    assert eagle3.weight_bytes_per_step == pytest.approx(0.849e9, rel=1e-3)
    assert eagle3.kv_bytes_per_token == 2 * 1 * 8 * 128 * 2
    eagle = head_spec("eagle-head", target)
    # EAGLE-1 reads the target's LM head every draft forward but stores neither it nor the embedding
    assert eagle.weight_bytes_per_step == 2 * (layer + 2 * e * e + 128256 * e)
    assert eagle.weight_bytes == pytest.approx(2 * (layer + 2 * e * e + 3 * e), rel=1e-6)
    assert resolve_drafter("ngram", target, "bfloat16") is None
    assert resolve_drafter("llama-3.2-1b", target, "bfloat16").name == "Llama-3.2-1B"
    with pytest.raises(ValueError, match="draft head 'medusa' is unknown"):
        head_spec("medusa", target)


def test_alpha_from_a_mean_accepted_length():
    for k, length in ((3, 2.4), (4, 1.0), (4, 5.0), (1, 1.7)):
        assert expected_accepted_length(alpha_for_accepted_length(length, k), k) == pytest.approx(length, abs=1e-6)
    tree = canonical_tree(4, 4, 16)
    assert expected_tree_length(alpha_for_accepted_length(3.2, 4, tree), tree) == pytest.approx(3.2, abs=1e-6)
    with pytest.raises(ValueError, match="must be in"):
        alpha_for_accepted_length(4.5, 3)


def test_a_head_and_a_lookup_in_the_simulator():
    rows = sweep(model="llama-3.1-8b", draft="eagle3-head", k=3, acceptance_length=2.4, concurrency=(1,),
                 num_requests=24, max_tokens=96)
    spec = next(r for r in rows if r["spec"] == "draft")
    assert spec["mean_accepted_length"] == pytest.approx(2.4, abs=0.2)
    free = sweep(model="llama-3.1-8b", draft="ngram", k=3, alpha=0.6, concurrency=(1,), num_requests=8, max_tokens=32)
    head = sweep(model="llama-3.1-8b", draft="eagle3-head", k=3, alpha=0.6, concurrency=(1,), num_requests=8,
                 max_tokens=32)
    speedup = lambda rows: next(r["speedup_vs_off"] for r in rows if r["spec"] == "draft")  # noqa: E731
    assert speedup(free) > speedup(head)  # the same acceptance without a forward to pay


def test_simulate_takes_a_head_and_an_acceptance_length(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["simulate", "--hardware", "h100@sglang-0.5-cuda-graphs", "--model", "llama-3.1-8b", "--draft",
                 "eagle3-head", "--k", "3", "--acceptance-length", "2.4", "--concurrency", "1",
                 "--num-requests", "4", "--max-tokens", "16", "--json", str(out)]) == 0
    assert "sglang-0.5-cuda-graphs" in capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert {r["spec"] for r in rows} == {"off", "draft"}


def test_engine_modes_swap_the_measured_overheads():
    h100 = load_hardware("h100")
    assert h100.engine_mode == "vllm-0.10-cuda-graphs"
    mega = load_hardware("h100@megakernel")
    assert mega.step_overhead_s == 0.0 and mega.forward_overhead_s == pytest.approx(24e-6)
    assert mega.sources["forward_overhead_s"].startswith("0.024 ms")
    back = mega.with_engine_mode("vllm-0.10-cuda-graphs")
    assert back.step_overhead_s == h100.step_overhead_s and back.draft_overhead_s == h100.draft_overhead_s
    assert load_hardware("h100", engine_mode="megakernel") == mega
    with pytest.raises(ValueError, match="no engine mode 'tensorrt'"):
        load_hardware("h100@tensorrt")
    for name in ("a100-80gb", "a40", "l40s", "rtx3090", "rtx4090", "h100", "h200", "b200", "mi300x"):
        hw = load_hardware(name)
        for key in ("forward_overhead_s", "draft_forward_overhead_s", "engine_mode", "overlap"):
            assert hw.sources.get(key), f"{name}: {key} has no source"


def test_step_forward_and_draft_overheads_by_hand():
    target = load_model_spec("llama-3.2-1b")
    hw = HardwareSpec("t", "t", 1e15, 1e12, 1e12, compute_efficiency=1.0, bandwidth_efficiency=1.0,
                      step_overhead_s=1e-3, forward_overhead_s=2e-4, draft_forward_overhead_s=5e-4)
    bare = CostModel(HardwareSpec("t", "t", 1e15, 1e12, 1e12, compute_efficiency=1.0, bandwidth_efficiency=1.0),
                     target, target)
    cm = CostModel(hw, target, target)
    args = (1, 1, 100, 100, 1)
    assert cm.forward_time_s(*args) == pytest.approx(bare.forward_time_s(*args) + 1.2e-3)
    assert cm.forward_time_s(*args, draft=True) == pytest.approx(bare.forward_time_s(*args, draft=True) + 5e-4)
    with pytest.raises(ValueError, match="step_overhead_s"):
        hw.with_overheads(step_overhead_s=-1.0)


def test_tensor_parallel_splits_bytes_and_adds_allreduces():
    hw, target = load_hardware("h100"), load_model_spec("llama-3-70b")
    one, four = CostModel(hw, target), CostModel(hw, target, tensor_parallel_size=4)
    a, b = one.forward_cost(1, 1, 101, 101, 1), four.forward_cost(1, 1, 101, 101, 1)
    assert b.bytes == pytest.approx((target.weight_bytes_per_step / 4) + target.hidden_size * 2
                                    + 101 * target.kv_bytes_per_token / 4)
    allreduces = 2 * target.num_layers * (hw.allreduce_latency_s + 2 * 3 / 4 * target.hidden_size * 2
                                          / hw.interconnect_bandwidth_bytes_per_s)
    assert b.overhead_s - a.overhead_s == pytest.approx(allreduces)
    assert kv_budget_bytes(hw, target, None, 0.9, 4) == pytest.approx(4 * 0.9 * 80e9 - target.weight_bytes)
    with pytest.raises(ValueError, match="no all-reduce latency"):
        CostModel(load_hardware("l4"), load_model_spec("llama-3.2-1b"), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="do not split"):
        CostModel(hw, load_model_spec("qwama-0.5b"), tensor_parallel_size=4)
