"""The helpers behind notebooks 08 and 09 (course/capstone_lab.py, device_lab.py): each sentence
is chosen from the numbers given, on small hand-made reports and runs (no model, no simulation)."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest

from course import capstone_lab
from course import device_lab as lab
from course.gpu import load_gpu_results
from course.noise import compare, rank
from course.scenarios import capstone_scenario

LEVERS = ["batch harder", "quantize", "prefix-cache", "speculate"]


# --- notebook 08: the capstone's report in sentences ---

def lane_row(attainment=1.0, tpot_s=0.010, bulk=1000.0, fleet=2000.0, **fleet_keys):
    row = {"interactive_attainment": attainment, "interactive_tpot_p50_s": tpot_s, "bulk_throughput_tok_s": bulk,
           "fleet_throughput_tok_s": fleet, "bulk_tpot_p50_s": tpot_s}
    row.update({"fleet_tpot_p50_s": 0.010, "fleet_tpot_mean_s": 0.010, "fleet_e2e_mean_s": 1.0, **fleet_keys})
    return row


def report_of(lanes: dict, verdicts: dict, passed: dict | None = None, target: float = 0.9) -> dict:
    """A grade_policy-shaped report: lanes[load][policy] rows, verdicts[load][policy] booleans."""
    scores = {load: {"verdicts": verdicts[load], "attainment_target": target,
                     "passed": (passed or {}).get(load, True)} for load in lanes}
    return {"lanes": lanes, "scores": scores}


def test_capstone_title_names_the_loads_a_policy_misses_or_the_leading_baseline():
    lanes = {4: {"never": lane_row(), "always": lane_row()}, 128: {"never": lane_row(), "always": lane_row()}}
    verdicts = {4: {"never": True, "always": True}, 128: {"never": True, "always": True}}
    assert capstone_lab.capstone_title(report_of(lanes, verdicts), yours=True) == \
        "Your policy passes at every load (c=4, c=128)"
    missed = report_of(lanes, verdicts, passed={4: True, 128: False})
    assert capstone_lab.capstone_title(missed, yours=True) == "Your policy misses at c=128"
    # baselines: meeting both goals ranks first, then attainment to two decimals, then fleet tokens/s
    lanes = {4: {"never": lane_row(attainment=0.99, fleet=900.0), "always": lane_row(attainment=0.50, fleet=100.0)},
             128: {"never": lane_row(attainment=0.901, fleet=100.0), "always": lane_row(attainment=0.899, fleet=200.0)}}
    verdicts = {4: {"never": False, "always": True}, 128: {"never": True, "always": True}}
    assert capstone_lab.capstone_title(report_of(lanes, verdicts), yours=False) == \
        "Baselines only; leading at each load: c=4 always, c=128 always"


def test_policy_lines_state_each_policys_bulk_share_and_verdict():
    lanes = {32: {"never": lane_row(bulk=1000.0), "lane": lane_row(attainment=0.95, tpot_s=0.0059, bulk=860.0)}}
    lines = capstone_lab.policy_lines(report_of(lanes, {32: {"never": True, "lane": False}}, target=0.42))
    assert lines[0] == "concurrency 32 (interactive target 0.42):"
    assert lines[2].startswith("          lane: attainment 0.95, interactive TPOT   5.9 ms, bulk 0.86 of never")
    assert lines[1].endswith(": meets both") and lines[2].endswith(": misses") and len(lines) == 3


def test_threshold_notes_only_where_the_load_switched_rule_fell_behind_above_16():
    lanes = {4: {"never": lane_row(fleet=500.0), "threshold:16": lane_row(fleet=400.0)},
             32: {"never": lane_row(fleet=2000.0), "threshold:16": lane_row(fleet=1900.0)},
             128: {"never": lane_row(fleet=3000.0), "threshold:16": lane_row(fleet=3100.0)}}
    notes = capstone_lab.threshold_notes({"lanes": lanes})
    assert len(notes) == 1 and notes[0].startswith("At c=32 threshold:16 made 0.95 of never's fleet tokens/s")
    assert capstone_lab.threshold_notes({"lanes": {64: {"never": lane_row()}}}) == []  # no such baseline


def test_everywhere_line_leaves_out_the_learners_policy():
    lanes = {4: {"never": lane_row(), "lane": lane_row(), "yours": lane_row()},
             32: {"never": lane_row(), "lane": lane_row(), "yours": lane_row()}}
    both = {4: {"never": True, "lane": True, "yours": True}, 32: {"never": True, "lane": False, "yours": True}}
    assert capstone_lab.everywhere_line(report_of(lanes, both)) == "Baselines that meet both goals at every load: never"
    none = {4: {"never": False, "lane": True, "yours": True}, 32: {"never": True, "lane": False, "yours": True}}
    assert capstone_lab.everywhere_line(report_of(lanes, none)).endswith("which is what your policy has to fix.")


def test_fleet_paradox_is_explained_per_route_only_where_it_happens(monkeypatch):
    scenario = capstone_scenario()
    calls = []

    def fake_run(s, policy):
        calls.append((s.concurrency, policy))
        tpot = {"never": {"chat": 0.020, "json": 0.020}, "always": {"chat": 0.010, "json": 0.030}}[policy]
        return {"routes": {rt: {"tpot_p50_s": t} for rt, t in tpot.items()}}

    monkeypatch.setattr(capstone_lab, "run_scenario", fake_run)
    never = lane_row(fleet_throughput_tok_s=1000.0, fleet_tpot_p50_s=0.02, fleet_tpot_mean_s=0.02, fleet_e2e_mean_s=2.0)
    faster = lane_row(fleet_throughput_tok_s=1200.0, fleet_tpot_p50_s=0.01, fleet_tpot_mean_s=0.01, fleet_e2e_mean_s=1.0)
    paradox = lane_row(fleet_throughput_tok_s=900.0, fleet_tpot_p50_s=0.018, fleet_tpot_mean_s=0.024,
                       fleet_e2e_mean_s=2.4)
    lines = capstone_lab.fleet_paradox_lines({"lanes": {4: {"never": never, "always": faster},
                                                        128: {"never": never, "always": paradox}}}, scenario)
    assert lines[0].startswith("Speculating everyone (always) against nobody (never)")
    assert lines[1].split() == ["c=4", "0.50x", "0.50x", "0.50x", "1.20x"]
    assert calls == [(128, "never"), (128, "always")]  # only the paradox load is rerun
    assert len(lines) == 4 and lines[3].startswith("At c=128 always lowers the median request's TPOT (0.90x)")
    assert "chat 20.0 -> 10.0 ms, json 20.0 -> 30.0 ms" in lines[3]
    assert f"The json route (alpha {scenario.routes['json'][0]})" in lines[3]


# --- notebook 09: the packed-device lab ---

def test_here_table_and_notes():
    rows = {"baseline": [{"ttft_p50_s": 1.0, "tpot_p50_s": 0.1, "prefix_cache_hit_rate": None, "goodput_rps": 0.5},
                         {"ttft_p50_s": 3.0, "tpot_p50_s": 0.3, "prefix_cache_hit_rate": None, "goodput_rps": 0.7}],
            "prefix-cache": [{"ttft_p50_s": 0.5, "tpot_p50_s": 0.1, "prefix_cache_hit_rate": 0.9, "goodput_rps": 0.0},
                             {"ttft_p50_s": 0.5, "tpot_p50_s": 0.1, "prefix_cache_hit_rate": 0.94, "goodput_rps": 0.0}]}
    tok = {"baseline": [2.0, 2.0], "prefix-cache": [4.0, 4.4]}
    verdict = {"prefix-cache": compare(tok["prefix-cache"], tok["baseline"])}
    table = lab.here_table(rows, tok, verdict, {"baseline": 0.6, "prefix-cache": 0.0})
    assert table[0]["vs baseline (tokens per device-second)"] == "the reference" and table[0]["hit rate"] == "-"
    assert table[0]["TTFT p50"] == "2.00 s" and table[0]["TPOT p50"] == "200 ms"
    assert table[1]["hit rate"] == "0.94" and table[1]["tok/s per round"] == "4.0, 4.4"
    assert table[1]["vs baseline (tokens per device-second)"].startswith("more: 2.10x")
    notes = lab.here_notes({"baseline": 0.6, "prefix-cache": 0.0}, 16.0, 0.431, rounds=1)
    assert notes[0].startswith("Goodput 0.00 (prefix-cache): ") and "TPOT under 431 ms" in notes[0]
    assert notes[1].startswith("One round (fast mode)")
    assert lab.here_notes({"baseline": 0.6}, 16.0, 0.431, rounds=2) == []


def test_plot_levers_draws_one_bar_per_arm_with_the_spread():
    ratios = {"batch harder": 1.5, "speculate": 0.9, "all four": 2.0}
    fig = lab.plot_levers(ratios, {n: r - 0.1 for n, r in ratios.items()}, {n: r + 0.2 for n, r in ratios.items()},
                          {n: 1.0 for n in ratios}, "a computed title")
    ax = fig.axes[0]
    bars = ax.patches
    assert [round(b.get_width(), 2) for b in bars] == [1.5, 0.9, 2.0]
    assert [matplotlib.colors.to_hex(b.get_facecolor()[:3]) for b in bars] == \
        [matplotlib.colors.to_hex(c) for c in ("tab:blue", "tab:red", "tab:red")]
    assert ax.get_title() == "a computed title" and "goodput 1.00 req/s" in ax.get_yticklabels()[0].get_text()
    plt.close(fig)


def ranked(values: dict) -> tuple:
    """Two rounds per lever (the baseline at 1.0): the Ranking and each lever's Verdict."""
    tok = {n: [v, v] for n, v in values.items()}
    return rank(tok), {n: compare(tok[n], [1.0, 1.0]) for n in values}


def test_here_title_names_a_place_only_where_the_rounds_settle_it():
    ranking, verdicts = ranked({"prefix-cache": 2.0, "batch harder": 1.5, "quantize": 1.48, "speculate": 0.8})
    on_top = compare([0.9, 0.9], [1.0, 1.0])
    title = lab.here_title(4, 4, ranking, verdicts, on_top, unclear=[])
    assert title.startswith("This CPU, 4 shared-prefix requests at concurrency 4: prefix-cache gains most alone "
                            "(2.00x), speculate least (0.80x);\n")
    assert title.endswith("fewer tokens per device-second: 0.90x (0.90-0.90 over the rounds)")
    ranking, verdicts = ranked({"prefix-cache": 2.0, "batch harder": 1.98, "quantize": 0.82, "speculate": 0.8})
    title = lab.here_title(4, 4, ranking, verdicts, on_top, unclear=["speculate"])
    assert "prefix-cache highest by median (not settled against batch harder)" in title
    assert "speculate lowest by median (not settled against quantize)" in title
    assert title.endswith("; 1 of 4 levers not clear on this run")
    assert lab.unclear_note(["quantize"], 1).startswith("Not a clear finding on this run (quantize): one round")
    assert "the rounds disagree" in lab.unclear_note(["quantize"], 3)


def test_h100_table_and_title():
    row = {"throughput_tok_s": 5000.0, "goodput_rps": 12.34, "ttft_p50_s": 0.25, "tpot_p50_s": 0.0301,
           "prefix_cache_hit_rate": None}
    rows = {"baseline": row, "all four": {**row, "prefix_cache_hit_rate": 0.5}}
    table = lab.h100_table(rows, {"all four": 1.25})
    assert [r["vs baseline"] for r in table] == ["1.00x", "1.25x"] and table[0]["TPOT p50"] == "30.1 ms"
    assert [r["hit rate"] for r in table] == ["-", "0.50"] and table[0]["goodput req/s"] == "12.3"
    title = lab.h100_title(128, ["prefix-cache", "batch harder", "quantize", "speculate"],
                           {"prefix-cache": 1.7, "speculate": 1.15}, 0.73,
                           {lab.THREE: 198.0, lab.ALL_FOUR: 144.0})
    assert title == ("H100 model, 8B target, concurrency 128: prefix-cache gains most alone (1.70x), speculate "
                     "least (1.15x);\nspeculation on top of the other three: 0.73x the tokens per device-second, "
                     "goodput 198 -> 144 req/s")


COST = {"draft_s": 0.003, "verify_s": 0.001, "other_s": 0.0, "step_s": 0.004, "plain_step_s": 0.010,
        "cause": "the drafter's sequential forwards"}


def test_lever_reasons_cover_every_lever_and_direction():
    reasons = lab.lever_reasons(16, None, COST, 120.0)
    assert set(reasons) == {(n, d) for n in LEVERS for d in ("higher", "lower")} | {("speculate", "last")}
    assert "against 16 output tokens" in reasons[("prefix-cache", "higher")]
    assert reasons[("speculate", "lower")].startswith("here no step decoded alone, so the split is not measured")
    assert "a decode step took 10.00 -> 14.00 ms" in reasons[("speculate", "last")] and "120 draft rows" in \
        reasons[("speculate", "last")]
    assert lab.split_text(COST, "here").startswith("here a decode step took 10.00 -> 14.00 ms")


def test_takeaway_gives_the_reason_only_for_a_settled_place():
    h100_rank = ["prefix-cache", "batch harder", "quantize", "speculate"]
    h100_ratio = {"prefix-cache": 1.7, "batch harder": 1.5, "quantize": 1.3, "speculate": 1.1}
    goodput = {lab.THREE: 198.0, lab.ALL_FOUR: 144.0}
    reasons = lab.lever_reasons(16, COST, COST, 120.0)
    on_top = compare([0.8, 0.8], [1.0, 1.0])
    # here: quantize first and settled, batch harder third; speculate last on both
    ranking, verdicts = ranked({"quantize": 3.0, "prefix-cache": 2.0, "batch harder": 1.5, "speculate": 0.9})
    text = lab.takeaway(LEVERS, ranking, verdicts, on_top, h100_rank, h100_ratio, goodput, 0.73, reasons)
    assert text.startswith("Both rank speculate #4.")
    assert f"quantize ranks #1 here and #3 on the H100: {reasons[('quantize', 'higher')]}." in text
    assert f"batch harder ranks #3 here and #2 on the H100: {reasons[('batch harder', 'lower')]}." in text
    assert f"Speculation ranks last on both: {reasons[('speculate', 'last')]}." in text
    assert text.endswith("(goodput 198 -> 144 req/s) and here fewer: 0.80x (0.80-0.80 over the rounds).")
    assert [r["rank here"] for r in lab.ranking_rows(LEVERS, ranking, verdicts, h100_rank, h100_ratio)] == [3, 1, 2, 4]
    # quantize within 5% of prefix-cache: its place is not settled, so no reason is given
    ranking, verdicts = ranked({"quantize": 2.05, "prefix-cache": 2.0, "speculate": 1.5, "batch harder": 0.9})
    text = lab.takeaway(LEVERS, ranking, verdicts, on_top, h100_rank, h100_ratio, goodput, 0.73, reasons)
    assert "quantize ranks #1 here and #3 on the H100: its place here is not settled on this run" in text
    assert "Speculation ranks last on the H100 model but not here." in text
    assert text.startswith("The two rankings share no place.")
    rows = lab.ranking_rows(LEVERS, ranking, verdicts, h100_rank, h100_ratio)
    assert [r["rank here"] for r in rows] == [4, "1 (not settled)", "2 (not settled)", 3]


def test_your_ranking_counts_the_places_that_match():
    measured = ["prefix-cache", "batch harder", "quantize", "speculate"]
    mine = ["prefix-cache", "quantize", "batch harder", "speculate"]
    assert lab.your_ranking("this CPU", mine, measured, LEVERS).startswith(
        "Your ranking for this CPU placed 2 of 4 where the numbers did (prefix-cache, speculate).")
    assert lab.your_ranking("the H100", [], measured, LEVERS) == \
        "You did not rank the levers for the H100; the numbers say prefix-cache > batch harder > quantize > speculate."


def gpu_run(rows: list[tuple[int, int, float, float]]) -> dict:
    """A load_gpu_results-shaped run of one shape: (requests, tokens per request, step ms, roofline ms)."""
    return {"device": {"name": "GPU X"}, "date": "2026-01-01",
            "steps": {"m": {"shape": "M", "rows": [
                {"mode": mode, "requests": b, "tokens_per_request": q, "tokens": b * q, "context": 64,
                 "step_ms": step * (3 if mode == "eager" else 1), "roofline_ms": roof}
                for mode in ("eager", "graphs") for b, q, step, roof in rows]}}}


def test_real_step_lines_compute_each_ratio_from_the_run():
    gpu = gpu_run([(2, 1, 4.0, 1.0), (8, 1, 8.0, 2.0), (2, 5, 5.0, 1.0)])
    first, batching, share = lab.real_step_lines(gpu, "m", batch=2, packed=8, k=4)
    assert first == ("GPU X (2026-01-01), this engine with CUDA graphs, M's shape at a 64-token context: 2 decodes "
                     "4.00 ms, 4.00x its roofline (1.00 ms); 8 decodes 8.00 ms, 4.00x its roofline (2.00 ms); 2 "
                     "verifies of 5 tokens 5.00 ms, 5.00x its roofline (1.00 ms).")
    assert batching == ("Batching 2 -> 8 decodes gave 2.00x the tokens per second of step time (the roofline: "
                        "2.00x); 4 draft rows per request made a 2-request step 1.25x longer (the roofline: 1.00x).")
    assert share.startswith("The roofline is 25% of a real 8-decode step") and "the other 6.00 ms" in share
    with pytest.raises(ValueError, match="no 2x3 step of m; it has 2x1, 8x1, 2x5"):
        lab.real_step_lines(gpu, "m", batch=2, packed=8, k=2)


def test_the_committed_h200_run_has_the_shapes_notebook_09_reads():
    gpu = load_gpu_results("h200")
    lines = lab.real_step_lines(gpu, "llama-3-8b", batch=32, packed=128, k=4)
    big = lab.real_step(gpu, "llama-3-8b", 128)
    assert len(lines) == 3 and big["step_ms"] > big["roofline_ms"]  # a real step never beats its roofline
    assert f"128 decodes {big['step_ms']:.2f} ms" in lines[0]


def test_here_notes_label_an_emulated_quantize_lever_with_the_native_run_s_ratio(tmp_path, monkeypatch):
    """Issue 56, item 2: on a CPU without AVX512-BF16 or AMX notebook 10's quantize arms run int4
    emulated; the notes say so, with the reference run's ratio where int4 is native, and say nothing
    where it is native."""
    why = "emulated: its activations are bfloat16, and this CPU has no AVX512-BF16 or AMX"
    notes = lab.here_notes({"baseline": 0.6}, 16.0, 0.431, rounds=2, quant_support=why)
    assert len(notes) == 1 and "runs emulated on this CPU (its activations are bfloat16" in notes[0]
    assert f"quantize gave {lab.native_quantize_ratio():.2f}x" in notes[0]
    assert lab.here_notes({"baseline": 0.6}, 16.0, 0.431, rounds=2, quant_support="native") == []
    run = {"notebooks": {"10_packed_device_lab": {"full": {"headlines": [
        "This CPU, 8 requests: prefix-cache gains most alone (3.11x), quantize least (0.87x);"]}}}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert lab.native_quantize_ratio(tmp_path / "run.json") == 0.87
    assert lab.native_quantize_ratio(tmp_path / "missing.json") is None
    run["notebooks"]["10_packed_device_lab"]["full"]["headlines"] = ["speculate least (0.80x)"]
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert lab.native_quantize_ratio(tmp_path / "run.json") is None
