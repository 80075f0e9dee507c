"""Lanes and routes that can pay (issue 34): bench and simulate rows report each lane's and route's
own metrics, the command lines take lanes, routes and opt-outs, a step in which no request drafts
runs no draft loop on either clock, and the premium-lane target holds on the H100 model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import tiny_engine
from minispec.tools.bench import ROW_KEYS, bench_rows, format_table, spec_configs
from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.request import SamplingParams
from minispec.sim import build_sim_engine, sweep
from minispec.tools.workload import lanes_by_share, parse_lanes

ISSUE = dict(model="llama-3-8b", alpha=0.8, k=4, prompt_len=1024, max_tokens=64, num_requests=256)


def test_lane_shares_parse_and_spread_evenly():
    assert parse_lanes("interactive=0.15") == 0.15 and parse_lanes("bulk=0.85") == pytest.approx(0.15)
    lanes = [lanes_by_share(0.15)(i) for i in range(20)]
    assert lanes.count("interactive") == 3 and "interactive" not in lanes[:5]  # spread, not a block at the start
    for bad in ("premium=0.2", "interactive=1.5", "interactive=half", "interactive=0.2,bulk=0.7"):
        with pytest.raises(ValueError, match="lanes"):
            parse_lanes(bad)


def test_rows_report_each_lane_and_route_under_the_rows_keys():
    rows = sweep(draft="ngram", concurrency=[32], num_requests=120, prompt_len=256, max_tokens=32, policy="lane",
                 routes="chat=0.8:3,json=0.3:1", lanes="interactive=0.15", opt_out_routes=("json",))
    for row in rows:
        assert set(row["lanes"]) == {"interactive", "bulk"} and set(row["routes"]) == {"chat", "json"}
        keys = {key for key in ROW_KEYS if key in row["lanes"]["bulk"]}
        assert keys >= {"throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "goodput_rps",
                        "num_requests"}
        assert sum(m["num_requests"] for m in row["lanes"].values()) == 120
        assert sum(m["throughput_tok_s"] for m in row["lanes"].values()) == pytest.approx(row["throughput_tok_s"])
    spec = next(r for r in rows if r["spec"] != "off")
    assert spec["routes"]["json"]["acceptance_rate"] is None       # opted out: never drafted
    assert spec["lanes"]["bulk"]["acceptance_rate"] is None        # the lane policy: bulk stays plain
    assert spec["lanes"]["interactive"]["acceptance_rate"] is not None
    table = format_table(rows)
    assert "lane interactive" in table and "route json" in table


def run_cli(tmp_path, *args: str, timeout: int = 300):
    """``python -m minispec <args> --json <file>``; returns (the finished process, the rows it wrote)."""
    out = tmp_path / "rows.json"
    res = subprocess.run([sys.executable, "-m", "minispec", *args, "--json", str(out)],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res, json.loads(out.read_text())


def test_simulate_takes_lanes_routes_and_opt_outs_from_the_command_line(tmp_path):
    res, rows = run_cli(tmp_path, "simulate", "--draft", "ngram", "--concurrency", "8", "--num-requests", "40",
                        "--max-tokens", "16", "--policy", "lane", "--lanes", "interactive=0.2",
                        "--routes", "chat=0.8:3,json=0.3:1", "--opt-out", "json")
    assert all(set(r["lanes"]) == {"interactive", "bulk"} and set(r["routes"]) == {"chat", "json"} for r in rows)
    assert "lane bulk" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "minispec", "simulate", "--opt-out", "json", "--concurrency", "1",
                          "--num-requests", "1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--opt-out" in bad.stderr


def test_bench_rows_split_lanes_on_the_real_engine():
    def make_engine(spec):
        return tiny_engine(spec=spec, max_num_batched_tokens=64, enable_prefix_caching=False)
    rows = bench_rows(make_engine, spec_configs("off,ngram", k=2, policy="lane"), [2], 6,
                      [list(range(3, 20)), [5, 6, 7, 5, 6, 7, 5, 6]], SamplingParams(max_tokens=6, temperature=0,
                                                                                    ignore_eos=True),
                      lane_of=lanes_by_share(0.5), warmup=False, progress=False)
    for row in rows:
        assert {m["num_requests"] for m in row["lanes"].values()} == {3}


@pytest.mark.parametrize("clock", ["real", "virtual"])
def test_a_step_in_which_no_request_speculates_runs_no_draft_loop(clock):
    """The bulk lane's steps without a premium request in them wait for no draft: neither executor
    calls the drafter (or prices its loop) when no scheduled request was given k > 0."""
    config = EngineConfig(model="tiny", device="cpu", block_size=4, num_kv_blocks=64, max_model_len=96,
                          spec=SpecConfig(method="draft", num_speculative_tokens=3, alpha=0.8, policy="lane"))
    if clock == "real":
        from minispec.build import build_engine
        from minispec.models.llama import LlamaModel
        from conftest import tiny_config
        target = LlamaModel.random(tiny_config(), seed=0)
        engine = build_engine(config, model=target, draft=LlamaModel.random(tiny_config(num_layers=1), seed=5))
        calls = []
        inner = engine.drafter.inner
        propose = inner.propose
        inner.propose = lambda scheduled: (calls.append(len(scheduled)), propose(scheduled))
    else:
        from minispec.cost.modelspec import ModelSpec
        from conftest import tiny_config
        engine = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"),
                                  draft=ModelSpec.of(tiny_config(num_layers=1), "float32"))
    steps = []
    engine.add_observer(lambda record: steps.append(record))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), lane="interactive")
    engine.add_request([4, 5, 6], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), lane="bulk")
    engine.run_until_done()
    bulk_alone = [r for r in steps if all(s.request.lane == "bulk" for s in r.batch.scheduled)]
    assert len(bulk_alone) >= 5
    if clock == "virtual":
        assert all(r.stats.draft_time_s == 0.0 for r in bulk_alone)
    else:
        assert len(calls) == sum(any(s.num_speculative_tokens for s in r.batch.scheduled) for r in steps) > 0


def test_a_premium_lane_pays_with_a_cheap_drafter_on_the_h100_model():
    """The issue's target: 15% of the requests in the premium lane at concurrency 32 (closed loop, 8B
    target, alpha 0.8, k 4, 1,024-token prompts, 64 tokens). With n-gram drafting (no draft forwards,
    only the premium lane's verify rows in each step) the premium lane's p50 TPOT is at least 1.3x
    lower than with speculation off and the bulk lane keeps at least 90% of its throughput; a 1B draft
    model's sequential forwards, which every request in the step waits for, cost the bulk lane more."""
    rows = {draft: {r["spec"]: r for r in sweep(draft=draft, concurrency=[32], policy="lane",
                                                   lanes="interactive=0.15", **ISSUE)}
            for draft in ("ngram", "llama-3.2-1b")}
    ngram = rows["ngram"]
    off, lane = ngram["off"]["lanes"], ngram["draft"]["lanes"]
    assert off["interactive"]["tpot_p50_s"] >= 1.3 * lane["interactive"]["tpot_p50_s"]
    assert lane["bulk"]["throughput_tok_s"] >= 0.9 * off["bulk"]["throughput_tok_s"]
    one_b = rows["llama-3.2-1b"]
    assert one_b["draft"]["lanes"]["bulk"]["throughput_tok_s"] < 0.9 * one_b["off"]["lanes"]["bulk"]["throughput_tok_s"]


def test_bench_takes_lanes_routes_and_opt_outs_from_the_command_line(tmp_path):
    _, (row,) = run_cli(tmp_path, "bench", "--spec", "ngram", "--policy", "lane", "--concurrency", "2",
                        "--num-requests", "4", "--max-tokens", "4", "--lanes", "interactive=0.5",
                        "--routes", "copy:1,chat:1", "--opt-out", "chat", timeout=600)
    assert set(row["lanes"]) == {"interactive", "bulk"} and set(row["routes"]) == {"copy", "chat"}
    assert all(m["num_requests"] == 2 for kind in ("lanes", "routes") for m in row[kind].values())
    assert row["routes"]["chat"]["acceptance_rate"] is None  # opted out
    assert row["decode_split"] is None or {"draft_s", "target_s", "other_s"} <= set(row["decode_split"])
