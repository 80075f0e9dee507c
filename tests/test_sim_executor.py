"""The simulated executor: virtual clock, acceptance draws, step times, and the shared engine code."""

from __future__ import annotations

import json
import math
import random

import pytest
from conftest import tiny_engine

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.core.engine import Engine
from minispec.guard.engine_guard import GuardedEngine
from minispec.tools.summary import summarize
from minispec.core.request import SamplingParams
from minispec.core.scheduler import Scheduler
from minispec.sim import build_sim_engine, expected_accepted_length
from minispec.speculation.acceptance import FixedAlpha, RouteAlpha, TraceAcceptance, load_trace, parse_routes
from minispec.sim.executor import SimExecutor, VirtualClock, kv_budget_bytes
from minispec.cost.hardware import load_hardware
from minispec.cost.modelspec import load_model_spec
from minispec.tools.workload import run_closed_loop, run_poisson
from minispec.tools.summary import StepLog


def sim_config(method="off", k=4, alpha=0.8, policy="always", **sched) -> EngineConfig:
    sched = {"max_num_batched_tokens": 8192, "max_num_seqs": 256, **sched}
    return EngineConfig(model="llama-3-8b", scheduler=SchedulerConfig(**sched),
                        spec=SpecConfig(method=method, num_speculative_tokens=k, alpha=alpha, policy=policy))


def accepted_length_moments(alpha: float, k: int) -> tuple[float, float]:
    """Mean and variance of emitted tokens per verify, 1 + min(Geometric run, k)."""
    probs = [alpha ** a * (1 - alpha) for a in range(k)] + [alpha ** k]
    mean = sum((a + 1) * p for a, p in enumerate(probs))
    return mean, sum((a + 1 - mean) ** 2 * p for a, p in enumerate(probs))


def test_virtual_clock():
    clock = VirtualClock()
    assert clock() == 0.0
    clock.advance(0.5)
    clock.advance_to(0.25)  # already passed: stays
    assert clock() == 0.5
    clock.advance_to(2.0)
    assert clock() == 2.0
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1.0)


def test_one_scheduler_module_serves_both_executors(tiny_model):
    real = tiny_engine(tiny_model)
    sim = build_sim_engine(sim_config())
    assert type(sim) is type(real) is GuardedEngine and isinstance(sim, Engine)  # one engine class, both clocks
    assert type(sim.scheduler) is Scheduler and type(real.scheduler) is Scheduler
    assert isinstance(sim.executor, SimExecutor) and sim.clock is sim.executor.clock


@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_fixed_alpha_draw_has_the_geometric_mean(alpha):
    k, n = 4, 20000
    model = FixedAlpha(alpha, seed=1)
    mean = sum(model.draw(None, k) + 1 for _ in range(n)) / n
    want, var = accepted_length_moments(alpha, k)
    assert want == pytest.approx(expected_accepted_length(alpha, k))
    # 4 standard errors: a false failure about once in 16,000 runs
    assert abs(mean - want) < 4 * math.sqrt(var / n)


@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_simulated_mean_accepted_length_matches_formula(alpha):
    k = 4
    engine = build_sim_engine(sim_config("synthetic", k=k, alpha=alpha))
    log = engine.add_observer(StepLog())
    reqs, wall = run_closed_loop(engine, [[0] * 64], 8, 64, SamplingParams(max_tokens=200, ignore_eos=True))
    summary = summarize(reqs, wall, log.stats)
    num_verifies = sum(r.num_verify_steps for r in reqs)
    want, var = accepted_length_moments(alpha, k)
    # steps near a request's end are clamped to fewer drafts; count only full-k verifies' share
    assert summary["mean_accepted_length"] == pytest.approx(want, abs=4 * math.sqrt(var / num_verifies) + 0.02)
    assert all(r.num_output_tokens == 200 for r in reqs)


def test_spec_off_step_times_are_the_cost_model_times():
    engine = build_sim_engine(sim_config())
    cm = engine.executor.cost_model
    prompt, out = 100, 20
    reqs, wall = run_closed_loop(engine, [[0] * prompt], 1, 1, SamplingParams(max_tokens=out, ignore_eos=True))
    prefill = cm.items_cost([(prompt, 0, 1)]).time_s
    decodes = [cm.items_cost([(1, prompt + i, 1)]).time_s for i in range(out - 1)]
    assert wall == pytest.approx(prefill + sum(decodes), rel=1e-9)
    m = summarize(reqs, wall)
    assert m["ttft_p50_s"] == pytest.approx(prefill, rel=1e-9)
    assert m["tpot_p50_s"] == pytest.approx(sum(decodes) / (out - 1), rel=1e-9)


def test_draft_model_speedup_at_batch_one_matches_leviathan():
    alpha, k = 0.8, 4
    params = SamplingParams(max_tokens=400, ignore_eos=True)
    off = build_sim_engine(sim_config())
    _, wall_off = run_closed_loop(off, [[0] * 32], 1, 4, params)
    spec = build_sim_engine(sim_config("draft", k=k, alpha=alpha), draft="llama-3.2-1b")
    spec_log = spec.add_observer(StepLog())
    reqs, wall_spec = run_closed_loop(spec, [[0] * 32], 1, 4, params)
    assert sum(s.draft_time_s for s in spec_log.stats) > 0
    cm = spec.executor.cost_model
    c = cm.forward_time_s(1, 1, 200, 200, 1, draft=True) / cm.forward_time_s(1, 1, 200, 200, 1)
    # Leviathan et al. 2023: speedup = E / (k c + 1), E = tokens per verify (the sampled one here);
    # the verify forward costs a little more than a decode, and the draft prefills the prompt once
    mean_len = summarize(reqs, wall_spec)["mean_accepted_length"]
    assert wall_off / wall_spec == pytest.approx(mean_len / (k * c + 1), rel=0.03)


def test_pool_is_sized_from_device_memory():
    hw, target = load_hardware("h100"), load_model_spec("llama-3-8b")
    engine = build_sim_engine(sim_config())
    blocks = engine.block_manager.num_blocks
    assert blocks == int(kv_budget_bytes(hw, target, None) // (16 * target.kv_bytes_per_token))
    assert blocks * 16 * target.kv_bytes_per_token == pytest.approx(0.9 * 80e9 - target.weight_bytes, rel=1e-3)
    with pytest.raises(ValueError, match="needs 141.1 GB of weights"):
        build_sim_engine(sim_config(), model="llama-3-70b")
    fp8 = build_sim_engine(sim_config(), hardware="h200", model="llama-3-70b", weight_dtype="fp8")
    assert fp8.executor.cost_model.target.weight_bytes == pytest.approx(70.6e9, rel=0.01)


def test_preemption_in_a_small_pool_still_finishes_everything():
    config = sim_config("synthetic", alpha=0.7)
    config.num_kv_blocks, config.max_model_len = 40, 256  # 640 tokens for 16 requests of up to 164
    engine = build_sim_engine(config)
    reqs, _ = run_closed_loop(engine, [[0] * 100], 16, 32, SamplingParams(max_tokens=64, ignore_eos=True))
    assert all(r.num_output_tokens == 64 for r in reqs)
    assert sum(r.num_preemptions for r in reqs) > 0
    assert engine.block_manager.num_free_blocks == 40
    engine.block_manager.check_invariants()


def test_poisson_arrivals_idle_the_virtual_clock():
    engine = build_sim_engine(sim_config())
    reqs, wall = run_poisson(engine, [[0] * 64], qps=2.0, num_requests=40,
                             params=SamplingParams(max_tokens=16, ignore_eos=True), seed=3,
                             wait_until=engine.clock.advance_to)
    arrivals = [r.arrival_time_s for r in reqs]
    assert arrivals == sorted(arrivals) and wall >= arrivals[-1]
    assert 40 / wall == pytest.approx(2.0, rel=0.35)  # 40 exponential gaps: the rate is rough
    assert all(r.first_token_time_s >= r.arrival_time_s for r in reqs)


def test_route_acceptance_differs_per_route():
    alphas, mix = parse_routes("chat=0.9:1,json=0.1:1")
    assert mix == ["chat", "json"]
    engine = build_sim_engine(sim_config("synthetic"), acceptance=RouteAlpha(alphas, seed=2))
    prompts = [[0] * 32, [1] * 32]
    reqs, _ = run_closed_loop(engine, prompts, 4, 40, SamplingParams(max_tokens=64, ignore_eos=True))
    rate = {route: sum(r.num_draft_accepted for r in reqs if r.prompt_token_ids[0] == route)
            / sum(r.num_draft_proposed for r in reqs if r.prompt_token_ids[0] == route) for route in (0, 1)}
    assert rate[0] > 0.6 and rate[1] < 0.2
    with pytest.raises(ValueError, match="write NAME=ALPHA"):
        parse_routes("chat:0.8")


def test_trace_acceptance_replays_per_position_rates(tmp_path):
    rates = [0.8, 0.5, 0.2]
    model = TraceAcceptance(rates, seed=5)
    n = 20000
    draws = [model.draw(None, 3) for _ in range(n)]
    for j, rate in enumerate(rates):
        got = sum(a > j for a in draws) / n
        assert abs(got - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"acceptance_by_position": [0.9, 0.6], "num_draft_proposed": 10},
                                {"acceptance_by_position": [0.5, 0.2], "num_draft_proposed": 30}]))
    assert load_trace(path).rates == pytest.approx([(9 + 15) / 40, (6 + 6) / 40])
    assert model.rate(4) == pytest.approx(0.2 * (0.2 / 0.5) ** 2)


def test_simulation_is_reproducible():
    def run():
        engine = build_sim_engine(sim_config("synthetic", alpha=0.6))
        reqs, wall = run_closed_loop(engine, [[0] * 50], 4, 12, SamplingParams(max_tokens=32, ignore_eos=True))
        return wall, [r.num_draft_accepted for r in reqs]

    assert run() == run()
    assert random.Random(0).random() == random.Random(0).random()


def test_sweep_returns_bench_rows_with_speedups():
    from minispec.tools.bench import ROW_KEYS
    from minispec.sim import sweep

    rows = sweep(concurrency=(1, 64), num_requests=64, max_tokens=32)
    assert len(rows) == 4
    for row in rows:
        assert set(ROW_KEYS) <= set(row) and row["hardware"] == "h100" and row["model"] == "Llama-3-8B"
    by = {(r["spec"], r["concurrency"]): r for r in rows}
    assert by[("draft", 1)]["speedup_vs_off"] > 1.2  # memory-bound batch 1: the messenger wins
    assert by[("draft", 64)]["speedup_vs_off"] < by[("draft", 1)]["speedup_vs_off"]


def test_cli_simulate_smoke(tmp_path, capsys):
    from minispec.cli import main

    out = tmp_path / "rows.json"
    rc = main(["simulate", "--hardware", "h100", "--model", "llama-3-8b", "--draft", "llama-3.2-1b", "--alpha", "0.8",
               "--k", "4", "--concurrency", "1,8", "--num-requests", "8", "--max-tokens", "16", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    assert {r["spec"] for r in rows} == {"off", "draft"} and all(r["hardware"] == "h100" for r in rows)
    assert "speedup" in capsys.readouterr().out
    assert main(["simulate", "--hardware", "tpu9", "--num-requests", "2"]) == 2
    assert "hardware 'tpu9' is unknown" in capsys.readouterr().err


def test_cli_simulate_models_a_shared_system_prompt_with_real_token_ids(tmp_path):
    """simulate --prompts shared --prefix-caching off,on: the bundled shared-prefix set, tokenized,
    so the simulator hashes real ids; the cache serves most prompt tokens and cuts TTFT (bench's
    budget of 512 tokens: the first prompt takes a whole step, so only it misses; with a budget that
    admits all 8 at once, all 8 would miss). Without --prefix-caching, simulate keeps it off (its
    default prompts are one repeated id)."""
    from minispec.cli import main

    out = tmp_path / "rows.json"
    assert main(["simulate", "--prompts", "shared", "--prefix-caching", "off,on", "--spec", "off", "--concurrency",
                 "8", "--num-requests", "16", "--max-tokens", "16", "--max-num-batched-tokens", "512",
                 "--json", str(out)]) == 0
    off, on = json.loads(out.read_text())
    assert (off["prefix_caching"], on["prefix_caching"]) == (False, True)
    assert off["prefix_cache_hit_rate"] is None and on["prefix_cache_hit_rate"] > 0.8
    assert on["ttft_p50_s"] < off["ttft_p50_s"]
    assert main(["simulate", "--spec", "off", "--concurrency", "4", "--num-requests", "8", "--max-tokens", "8",
                 "--json", str(out)]) == 0
    assert [r["prefix_caching"] for r in json.loads(out.read_text())] == [False]
