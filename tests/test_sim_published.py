"""The simulator against published tables: every table cited, and a guard per table that fails
when a point's error grows past the bound it reached (issue 35; bench/sim/sim_vs_published.py prints
the same comparison). The bounds are the errors reached when the guard was written, rounded up by
two to three points; the data files in data/published/ hold the published numbers and citations.
The simulator is deterministic for fixed seeds, so a guard that fails means the model changed."""

from __future__ import annotations

import pytest

from minispec.sim.published import KIND, available_tables, error_summary, load_table, shape_checks
from minispec.sim.published_tables import TABLES, reproduce

# |simulated / published - 1| reached per predicted point (fitted points must match within 2%)
BOUNDS = {
    "specdecode_bench": {"8b_gsm8k_b128": 0.14, "8b_sharegpt_b32_over_b1": 0.18, "70b_sharegpt_b32_over_b1": 0.18,
                         "8b_draft_target_ratio": 0.20, "70b_draft_target_ratio": 0.40},
    "gpustack_qwen3_8b_h100": {"speedup_bs2": 0.07, "speedup_bs4": 0.03, "speedup_bs8": 0.15,
                               "baseline_latency_bs1": 0.10, "baseline_latency_bs2": 0.10,
                               "baseline_latency_bs4": 0.09, "baseline_latency_bs8": 0.11,
                               "optimized_latency_bs1": 0.11, "optimized_latency_bs2": 0.16,
                               "optimized_latency_bs4": 0.10, "optimized_latency_bs8": 0.20},
    "vllm_blog_2024": {"sharegpt_draft_high_qps": 0.09, "cnn_ngram_high_qps": 0.93},
    "nano_vllm": {"nano_vllm_throughput": 0.11, "vllm_throughput": 0.06},
    "step_times_h100": {"vllm_bf16_bs1": 0.07, "vllm_bf16_bs2": 0.07, "vllm_bf16_bs4": 0.08, "vllm_bf16_bs8": 0.09,
                        "sglang_fp8_bs4": 0.25},
}


def test_every_table_is_cited_and_has_a_runner():
    assert set(available_tables()) == set(TABLES) == set(BOUNDS)
    for name in available_tables():
        table = load_table(name)
        cite = table["citation"]
        assert cite.get("url") or cite.get("paper"), name
        assert cite.get("where") and cite.get("date") and table.get("setup"), name
        for p in table["points"]:
            assert p["quantity"] in KIND and p["published"] > 0, (name, p["id"])
            assert p.get("fit") or p["id"] in BOUNDS[name], f"{name}: {p['id']} has no regression bound"


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_table_stays_within_the_bound_it_reached(name):
    results = reproduce(name)
    assert {r.point for r in results} == {p["id"] for p in load_table(name)["points"]}
    for r in results:
        bound = 0.02 if r.fitted else BOUNDS[name][r.point]
        assert abs(r.error) <= bound, (f"{name} {r.point}: published {r.published:.4g}, simulated "
                                       f"{r.simulated:.4g}, error {r.error:+.1%} (bound {bound:.0%})")
    if name != "vllm_blog_2024":  # its n-gram point at saturation is the known miss (below)
        assert shape_checks(results) == []


def test_the_known_misses_are_still_the_only_ones():
    # the shape holds except where vLLM's 2024 n-gram run on CNN/DailyMail fell to 0.56x at high
    # QPS and the simulator stays above 1 (docs/cost_model.md, sec. 9, says why it may be)
    results = reproduce("vllm_blog_2024")
    misses = shape_checks(results)
    assert len(misses) == 1 and "cnn_ngram_high_qps" in misses[0]
    summary = error_summary(results)
    assert summary["speedup"]["num_points"] == 2
