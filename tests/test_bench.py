"""Benchmark sweeps: interleaved runs, so every speedup compares neighbours; repeats report a spread."""

from __future__ import annotations

import pytest
import torch

from minispec.tools.bench import bench_rows, format_table, spec_configs
from minispec.base.config import EngineConfig, SchedulerConfig
from minispec.core.request import SamplingParams
from minispec.sim import build_sim_engine

from conftest import load_bench_script


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


def load_crossover():
    return load_bench_script("crossover")


def test_crossover_rows_pair_each_speedup_with_its_own_rounds_spec_off_run():
    """bench/course/crossover.py --repeats: a speculating row and the spec-off step time next to it come
    from one round, and the spec-off row is the round of median throughput. Before the fix the
    spec-off row was whichever round sorted second among equal speedups (1.0), so a table could
    pair a draft's step time with another round's spec-off step time."""
    def cell(spec, tok_s, step_s, speedup):
        return {"prompts": "chat", "concurrency": 1, "spec": spec, "throughput_tok_s": tok_s,
                "mean_step_s": step_s, "speedup_vs_off": speedup}

    rounds = [[cell("off", 40.0, 0.025, 1.0), cell("draft", 48.0, 0.030, 1.20)],   # round 1
              [cell("off", 30.0, 0.033, 1.0), cell("draft", 39.0, 0.038, 1.30)],   # round 2: slow spell
              [cell("off", 44.0, 0.023, 1.0), cell("draft", 48.4, 0.028, 1.10)]]   # round 3
    median_rows = load_crossover().median_rows
    off, draft = median_rows(rounds)
    assert off["throughput_tok_s"] == 40.0 and off["mean_step_s"] == 0.025          # median throughput: round 1
    assert draft["speedup_vs_off"] == 1.20 and draft["mean_step_s"] == 0.030        # median speedup: round 1
    assert draft["off_mean_step_s"] == 0.025 and draft["off_throughput_tok_s"] == 40.0
    assert draft["speedup_range"] == [1.10, 1.30] and draft["repeats"] == 3
    rounds[0][1]["speedup_vs_off"] = 1.35                                           # now round 2 is the median
    draft = median_rows(rounds)[1]
    assert draft["speedup_vs_off"] == 1.30 and draft["off_mean_step_s"] == 0.033
    assert "off_mean_step_s" not in median_rows(rounds)[0]


def test_draft_confidence_counts_every_generating_step_and_rejects_bad_settings():
    """bench/draft/draft_confidence.py: tokens per step counts plain decodes as well as verifies (a
    threshold turns verifies into plain decodes, which flatters the mean accepted length alone).
    Checked against the engine's own step log for one request run alone."""
    from minispec.base.config import SpecConfig
    from minispec.tools.summary import StepLog

    from conftest import tiny_engine
    from test_spec_exactness import NOISY_DRAFT, TARGET_MODEL

    module = load_bench_script("draft_confidence")
    with pytest.raises(ValueError, match="--settings entry '4': write k:threshold"):
        module.parse_settings("2:0,4")
    assert module.parse_settings("2:0, 4:0.3") == [(2, 0.0), (4, 0.3)]
    for threshold in (0.0, 0.015):
        engine = tiny_engine(TARGET_MODEL, draft=NOISY_DRAFT,
                             spec=SpecConfig(method="draft", num_speculative_tokens=4,
                                             draft_confidence_threshold=threshold))
        log = engine.add_observer(StepLog())
        rid = engine.add_request([1, 2, 3, 4, 5], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
        engine.run_until_done()
        r = engine.requests[rid]
        counts = module.generation_counts([r])
        assert counts["tokens_per_step"] == pytest.approx(30 / len(log.stats))  # one step emits each time
        assert counts["share_of_steps_verifying"] == pytest.approx(r.num_verify_steps / len(log.stats))
        assert counts["drafts_per_verify_step"] == pytest.approx(r.num_draft_proposed / r.num_verify_steps)
        if threshold:  # some steps decoded plainly: the mean accepted length overstates tokens per step
            assert counts["share_of_steps_verifying"] < 1.0
            assert counts["mean_accepted_length"] > counts["tokens_per_step"]


def test_eagle3_pilot_labels_match_the_trainers_and_keep_three_normalised_layers():
    """bench/draft/eagle3_pilot.py labels conversations with its own pass over the target's layers (to keep
    three layers' outputs): its final features and top-k labels must be the trainer's own."""
    from minispec.models.llama import LlamaModel
    from minispec.train.sharegpt import teacher_forced_records

    from conftest import tiny_config

    target = LlamaModel.random(tiny_config(num_layers=4), seed=3)
    pairs = [([1, 2, 3, 4], [5, 6, 7]), ([9, 8], [7, 6, 5, 4, 3])]
    mine = load_bench_script("eagle3_pilot").label(target, pairs, [0, 2, 3])
    theirs = teacher_forced_records(target, pairs, desc="test")
    e = target.cfg.hidden_size
    for a, b in zip(mine, theirs):
        assert torch.equal(a["topk_ids"], b["topk_ids"])
        assert torch.allclose(a["features"].float(), b["features"].float(), atol=1e-2)
        assert a["layers"].shape == (len(a["prompt_ids"]) + len(a["output_ids"]), 3 * e)
        rms = a["layers"].float().view(-1, 3, e).pow(2).mean(-1).sqrt()
        assert torch.allclose(rms, torch.ones_like(rms), atol=1e-2)  # each layer normalised on its own


def test_prefix_caching_settings_run_as_neighbouring_rows_each_with_its_hit_rate():
    """bench --prefix-caching off,on: at each load both settings run (spec off first in each), every
    row says its setting and hit rate (None with the cache off), and speedups compare spec settings
    within one prefix-caching setting. Prompts share a 60-token prefix (real ids: the simulator
    hashes them); each row's warm-up request is that shared prefix, which stays cached."""
    made = []

    def make_engine(spec, prefix_caching=True):
        made.append((spec.method, prefix_caching))
        config = EngineConfig(model="llama-3-8b", enable_prefix_caching=prefix_caching,
                              scheduler=SchedulerConfig(max_num_batched_tokens=2048), spec=spec)
        return build_sim_engine(config, hardware="h100")

    prompts = [list(range(1, 61)) + [100 + i] * 4 for i in range(4)]
    specs = spec_configs("synthetic,off", k=4, alpha=0.8)
    rows = bench_rows(make_engine, specs, [1, 2], 8, prompts, SamplingParams(max_tokens=8), progress=False,
                      prefix_caching=[False, True])
    assert made == [("off", False), ("synthetic", False), ("off", True), ("synthetic", True)] * 2
    assert [(r["concurrency"], r["prefix_caching"], r["spec"]) for r in rows] == \
        [(c, p, s) for c in (1, 2) for p in (False, True) for s in ("off", "synthetic")]
    for r in rows:
        off = next(o for o in rows if o["spec"] == "off" and o["concurrency"] == r["concurrency"]
                   and o["prefix_caching"] == r["prefix_caching"])
        assert r["speedup_vs_off"] == pytest.approx(r["throughput_tok_s"] / off["throughput_tok_s"])
        if r["prefix_caching"]:
            # the warm-up left the shared prefix cached: every request finds its 3 full blocks of 16,
            # 48 of its 64 tokens (the rest of the 60-token prefix is no full block)
            assert r["prefix_cache_hit_rate"] == pytest.approx(48 / 64)
        else:
            assert r["prefix_cache_hit_rate"] is None
    cold = next(r for r in rows if r["prefix_caching"] and r["concurrency"] == 1 and r["spec"] == "off")
    warm_off = next(r for r in rows if not r["prefix_caching"] and r["concurrency"] == 1 and r["spec"] == "off")
    assert cold["ttft_p50_s"] < warm_off["ttft_p50_s"]  # cached prefixes are not computed again
    assert "hit rate" in format_table(rows) and " on |" in format_table(rows)


def test_common_prefix_is_what_every_prompt_starts_with():
    from minispec.tools.bench import common_prefix

    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert common_prefix([[1, 2], [3, 4]]) == [] and common_prefix([[1, 2, 3]]) == []
    assert common_prefix([[7, 8, 9], [7, 8, 9]]) == [7, 8]  # never a whole prompt: it would be all cached


def test_course_budget_marks_a_flip_only_where_two_runs_claim_opposite_directions():
    """bench/course/course_budget.py --compare: a headline pair is a flip when the quiet run says one
    direction and the busy run the other; an unsettled headline ("too noisy", "not settled",
    "one round", "probably" aside) claims nothing, so it flips nothing."""
    module = load_bench_script("course_budget")
    assert module.direction("Speculation on top of chunking: faster: 1.20x (1.10-1.30 over the rounds)") == 1
    assert module.direction("throughput lower: 0.80x") == -1
    assert module.direction("too noisy to tell on this run (the rounds disagree on the direction): 1.01x") == 0
    assert module.direction("one round, no spread to judge it by: 1.40x (one round)") == 0
    run = lambda *heads: {"notebooks": {"03_x": {"full": {"headlines": list(heads)}}}}
    rows = module.compare_runs(run("n-gram: faster: 1.2x", "order of a and b not settled on this run"),
                               run("n-gram: slower: 0.9x", "a ahead of b (1.3x)"))
    assert [r["flip"] for r in rows] == [True, False] and [r["changed"] for r in rows] == [True, True]
    same = module.compare_runs(run("n-gram: faster: 1.2x"), run("n-gram: faster: 1.31x"))
    assert not same[0]["flip"] and not same[0]["changed"]  # only the numbers moved
    assert rows[0]["quiet"].startswith("n-gram: faster") and rows[0]["busy"].startswith("n-gram: slower")
