"""Benchmark sweeps: interleaved runs, so every speedup compares neighbours; repeats report a spread."""

from __future__ import annotations

import pytest

from minispec.bench import bench_rows, spec_configs
from minispec.config import EngineConfig, SchedulerConfig
from minispec.request import SamplingParams
from minispec.sim import build_sim_engine


def sim_factory(order: list):
    def make_engine(spec):
        order.append(spec.method)
        config = EngineConfig(model="llama-3-8b", scheduler=SchedulerConfig(max_num_batched_tokens=2048), spec=spec)
        return build_sim_engine(config, hardware="h100")
    return make_engine


def test_every_load_runs_spec_off_then_each_setting_before_the_next_load():
    order = []
    specs = spec_configs("synthetic,off", k=4, alpha=0.8)  # off given last: it still runs first
    rows = bench_rows(sim_factory(order), specs, [1, 4, 16], 4, [[1] * 64], SamplingParams(max_tokens=16),
                      progress=False)
    assert order == ["off", "synthetic"] * 3
    assert [(r["concurrency"], r["spec"]) for r in rows] == [(c, m) for c in (1, 4, 16) for m in ("off", "synthetic")]
    for r in rows:
        assert "repeat" not in r
        off = next(o for o in rows if o["spec"] == "off" and o["concurrency"] == r["concurrency"])
        assert r["speedup_vs_off"] == pytest.approx(r["throughput_tok_s"] / off["throughput_tok_s"])


def test_repeats_give_a_median_speedup_and_its_range():
    order = []
    specs = spec_configs("off,synthetic", k=4, alpha=0.8)
    rows = bench_rows(sim_factory(order), specs, [2], 4, [[1] * 64], SamplingParams(max_tokens=16),
                      progress=False, repeats=3)
    assert order == ["off", "synthetic"] * 3
    spec_row = next(r for r in rows if r["spec"] == "synthetic")
    assert spec_row["num_repeats"] == 3
    assert spec_row["speedup_min"] <= spec_row["speedup_vs_off"] <= spec_row["speedup_max"]
    with pytest.raises(ValueError, match="repeats=0"):
        bench_rows(sim_factory([]), specs, [2], 4, [[1] * 64], SamplingParams(max_tokens=16), repeats=0)
