"""A verdict states only what its numbers support (issue 57, item 2). Each test feeds the helper that
writes a sentence the numbers that made it contradict itself in the full run of 2026-12-07, and checks
the sentence now follows them: a rise or a fall only beyond the noise, a trade-off only where every
step shows it, an estimate never called a bound, a ratio's words read at the decimals printed, a knee
only where the rounds settle it, a panel title and the line under it from one value, a missed target
said where it is missed."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import course.chunking_lab as cl  # noqa: E402
import course.json_verdicts as jv  # noqa: E402
from course.capstone_lab import moved, paradox_sentence  # noqa: E402
from course.crossover_reports import arm_miss_line  # noqa: E402
from course.gpu import crossover_rows, load_gpu_results  # noqa: E402
from course.noise import Verdict  # noqa: E402
from course.published import plot_published_vs_sim, published_vs_sim, summary_line, table_errors  # noqa: E402
from course.roofline_lab import measured_title, this_machine_knee  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def notebook_cells(stem: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"]


# --- 03: the token-budget sweep ---------------------------------------------------------------------

def arrival(ttft_s: float, itl_ms: float) -> dict:
    return {"newcomer_ttft_s": ttft_s, "itl_p99_s": itl_ms / 1000}


# The full run: TTFT 2.70 s at budget 512 and 2.72 s at 1024, and budget 256 (3.75 s, 1,037 ms; the
# chunked run of the cell above, made earlier) worse than 128 on both axes. The other points are that
# run's shape: TTFT falling and the p99 ITL rising with the budget.
BUDGETS = [32, 64, 128, 256, 512, 1024]
FULL_RUN = {b: arrival(t, i) for b, t, i in zip(BUDGETS, [4.90, 4.10, 3.30, 3.75, 2.70, 2.72],
                                                   [110, 190, 400, 1037, 900, 1800])}


def test_a_ttft_within_the_noise_of_the_lowest_did_not_rise_again():
    itl, ttft, trade = cl.budget_sweep_lines(FULL_RUN, BUDGETS)
    assert "rose again" not in ttft  # 2.72 s against 2.70 s: 0.7%, inside the 5% dead zone
    assert ttft.startswith("The newcomer's TTFT was lowest at a budget of 512 (2.70 s), and 1024 came within "
                           "5% of it (2.72 s)")
    assert itl == "The budget of 32 kept the decoders' p99 ITL 16.4x lower than 1024 did."


def test_a_budget_worse_on_both_axes_is_named_instead_of_a_trade_off_that_holds():
    *_, trade = cl.budget_sweep_lines(FULL_RUN, BUDGETS)
    assert "the trade-off holds" not in trade and "held at each step" not in trade
    assert ("budget 256 did worse than 128 on both axes (TTFT 3.75 against 3.30 s, p99 ITL 1037 against "
            "400 ms)") in trade


def test_a_real_rise_and_a_clean_trade_off_are_still_said():
    rising = {b: arrival(t, i) for b, t, i in zip([64, 128, 512], [3.0, 2.0, 2.4], [10, 20, 40])}
    assert "rose again above it (2.40 s at 512, more than 5% higher)" in cl.budget_sweep_lines(rising, [64, 128, 512])[1]
    clean = {b: arrival(t, i) for b, t, i in zip([64, 128, 512], [3.0, 2.0, 1.0], [10, 20, 40])}
    assert cl.budget_sweep_lines(clean, [64, 128, 512])[2].endswith("the trade-off held at each step.")


# --- 07: the JSON route's verdict --------------------------------------------------------------------

def json_run(length: float | None, step_s: float) -> dict:
    return {"alpha": 0.5 if length else None, "mean_accepted_length": length, "forced_per_verify_step": None,
            "step_s": step_s, "draft_s": 0.01 if length else 0.0, "target_s": 0.03, "grammar_s": 0.001,
            "num_valid_json": 4}


def test_the_step_split_is_an_estimate_not_a_ceiling_the_measurement_can_pass():
    """The full run printed "so at most 1.03x was on offer" beside a measured 1.06x."""
    runs = {("spec off", "grammar"): [json_run(None, 0.040)] * 2, ("draft", "free"): [json_run(1.5, 0.050)] * 2,
            ("draft", "grammar"): [json_run(1.545, 0.060)] * 2, ("draft", "grammar+jump"): [json_run(1.545, 0.060)] * 2}
    tputs = {cell: [100.0, 100.0] for cell in runs} | {("draft", "grammar"): [106.0, 106.0],
                                                       ("draft", "grammar+jump"): [106.0, 106.0]}
    verdicts = {("draft", a): Verdict(1.06, 1.06, 1.06, "higher") for a in ("grammar", "grammar+jump")}
    first = jv.json_verdict_text(verdicts, runs, tputs).split("\n")[0]
    assert "at most" not in first and "on offer" not in first
    assert first.endswith("the split predicts about 1.03x, in line with the 1.06x measured.")
    far = jv.split_reading(1.03, 1.20)
    assert "more than 5% apart; they agree on the direction" in far and "trust the measured ratio" in far


# --- 08: always against never, whole fleet -----------------------------------------------------------

# the grader's ratios at concurrency 32 (always / never): p50 TPOT, mean TPOT, mean E2E, fleet tokens/s
AT_32 = {"fleet_tpot_p50_s": 0.8749735654569959, "fleet_tpot_mean_s": 1.1449990208880239,
         "fleet_e2e_mean_s": 0.9978830465318919, "fleet_throughput_tok_s": 0.9853077809081223}


def test_a_mean_that_did_not_move_is_not_said_to_go_the_other_way():
    """The full run said "the mean E2E (1.00x) went the other way" when it did not move."""
    text = paradox_sentence(32, AT_32)
    assert "other way" not in text
    assert "the mean TPOT rose (1.14x) and the mean E2E did not move (1.00x)" in text
    assert "The mean E2E did not grow, so it does not explain the lower output on its own" in text
    assert "that time grew" not in text


def test_the_words_of_a_ratio_follow_its_printed_decimals():
    assert moved(1.0049) == "did not move (1.00x)" and moved(0.9951) == "did not move (1.00x)"
    assert moved(1.13) == "rose (1.13x)" and moved(0.87) == "fell (0.87x)"
    grew = paradox_sentence(128, AT_32 | {"fleet_e2e_mean_s": 1.1277})
    assert "the mean E2E rose (1.13x). A closed loop's output follows the mean time a request holds its slot" in grew


# --- 01: the knee on the GPU chart ---------------------------------------------------------------------

def test_the_gpu_chart_states_no_knee_that_the_measured_chart_withheld():
    """c6 said "knee not settled (rounds spread 43%)"; c13 then said "this machine up to 4"."""
    assert "knee not settled" in measured_title([1, 2, 4, 8], [10.0, 11.0, 12.0, 20.0], 4, 0.43)
    text = this_machine_knee(4, 0.43)
    assert "up to" not in text and text == "this machine: knee not settled (rounds spread 43%)"
    assert this_machine_knee(8, 0.2) == "this machine up to 8"
    (cell,) = [c for c in notebook_cells("01_decode_is_memory_bound")
               if c["cell_type"] == "code" and "the 8B step within 25% of" in "".join(c["source"])]
    source = "".join(cell["source"])
    assert "this_machine_knee(here_flat, wobble)" in source and "this machine up to {here_flat}" not in source


# --- 09: the recap's ranking ---------------------------------------------------------------------------

def test_the_recap_ranks_no_lever_that_the_takeaway_ranks_from_the_run():
    """The recap said speculation "comes last" while the takeaway, computed from the run, ranked it third
    on this CPU. Static text cannot follow a run, so the recap leaves the ranks to the takeaway."""
    cells = notebook_cells("10_packed_device_lab")
    i = next(i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Recap" in "".join(c["source"]))
    recap = " ".join("".join(cells[i]["source"]).split())
    assert not any(word in recap for word in ("comes last", "ranks last", "comes first", "ranks first"))
    assert "takeaway above" in recap
    assert any("takeaway(" in "".join(c["source"]) for c in cells[:i] if c["cell_type"] == "code")


# --- 05: the GPU model against published tables and against the H200 run -------------------------------

def titles_and_lines():
    rows = published_vs_sim()
    fig = plot_published_vs_sim(rows=rows)
    titles = [ax.get_title() for ax in fig.axes[:2]]
    matplotlib.pyplot.close(fig)
    return rows, titles, table_errors(rows)


def test_a_panel_title_and_the_printed_line_quote_one_worst_error():
    """The step-time panel said "worst predicted error 6%" (its drawn vLLM points) while the line under
    it said 22.6% for the same table (SGLang's fp8 point)."""
    rows, titles, errors = titles_and_lines()
    steps = errors["step_times_h100"]
    assert f"{steps['worst']:.1%}" == "22.6%" and steps["worst_point"] == "sglang_fp8_bs4"
    assert f"worst predicted error {steps['worst']:.1%} ({steps['worst_point']}, not drawn)" in titles[1]
    assert "error 6%" not in titles[1]
    speedups = errors["gpustack_qwen3_8b_h100"]
    assert f"worst predicted error {speedups['worst']:.1%}" in titles[0]
    from course.published import table_error_text  # noqa: PLC0415 (the line the notebook prints)
    assert f"worst {steps['worst']:.1%}" in table_error_text("step_times_h100", steps)


def test_a_missed_target_is_said_in_the_summary():
    """Speedups: median 12%, worst 91% against targets of 10% and 20%, printed with no word of a miss."""
    line = summary_line(published_vs_sim())
    speedups = next(part for part in line.split("; ") if part.startswith("speedups"))
    assert speedups.startswith("speedups: median 12%, worst 91%") and speedups.endswith("misses both targets)")
    times = next(part for part in line.split("; ") if part.startswith("times"))
    assert times.endswith(("both targets met)", "misses its worst target)", "misses its median target)",
                           "misses both targets)"))


def test_the_arm_the_simulator_misses_is_said_and_the_others_are_not():
    """The H200 run's alpha-0.6 arm: a median simulator error of 34% (5% for alpha 0.8), unexplained."""
    rows = crossover_rows(load_gpu_results("h200"))
    by_arm = {arm: [r for r in rows if r["arm"] == arm] for arm in dict.fromkeys(r["arm"] for r in rows)}
    miss = arm_miss_line(by_arm["synthetic a=0.6"])
    assert miss.startswith("The simulator misses this arm: median error 34%, above the 10% target for speedups")
    assert "c=2 -> 4: 1.58x -> 1.99x" in miss and "c=32 -> 64: 0.80x -> 1.15x" in miss
    assert arm_miss_line(by_arm["synthetic a=0.8"]) is None and arm_miss_line(by_arm["1B draft a=0.8"]) is None
