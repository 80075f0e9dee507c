"""course.policy_lab: notebook 07's verdict sentences choose their words from the numbers, its
plots draw what they were given, and its headlines are recorded. Hand-made inputs, no engine run."""

import json
from types import SimpleNamespace

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course import policy_lab as pl  # noqa: E402
from course.claims import neighbour_cost  # noqa: E402
from course.noise import Verdict  # noqa: E402

GRID = [1, 4, 16, 32, 64, 128]
H100 = SimpleNamespace(step_overhead_s=0.002, draft_forward_overhead_s=0.0015)


@pytest.fixture
def headlines(tmp_path, monkeypatch):
    """The headlines recorded while the test runs (course.record appends to MINISPEC_RECORD)."""
    path = tmp_path / "record.jsonl"
    monkeypatch.setenv("MINISPEC_RECORD", str(path))
    def recorded():
        return [json.loads(line)["text"] for line in path.read_text().splitlines()] if path.exists() else []

    yield recorded
    plt.close("all")


# -- mistake 1 --------------------------------------------------------------------------------------
def test_the_sweep_text_names_where_always_starts_losing():
    always, gated = [2.0, 1.6, 1.2, 1.05, 0.9, 0.8], [2.0, 1.6, 1.2, 1.0, 1.0, 1.0]
    first, second, third, fourth = pl.threshold_sweep_text(GRID, always, gated, H100).split("\n")
    assert first.startswith("At concurrency 32, the load the notes name, always ran 1.05x spec off: on this")
    assert first.endswith("; in this run from concurrency 64, which is where the fix has to act.")
    assert second == "always: below 1.0 from concurrency 64, down to 0.80x."
    assert third.startswith("threshold:16 above 16 requests: 1.00x at c=32, 1.00x at c=64, 1.00x at c=128; "
                            "lowest 1.00x")
    assert "gave that up" in third  # always beat threshold:16 by more than 0.03 at c=32
    assert "2.00 ms per engine step, 1.50 ms per draft forward" in fourth and "at least 6.00 ms" in fourth


def test_the_sweep_text_when_the_mistake_shows_at_32_or_never():
    lost = pl.threshold_sweep_text(GRID, [2.0, 1.5, 1.1, 0.9, 0.7, 0.6], [2.0, 1.5, 1.1, 1.0, 1.0, 1.0], H100)
    assert lost.split("\n")[0].endswith("always ran 0.90x spec off: the mistake shows there.")
    assert "gave that up" not in lost
    never = pl.threshold_sweep_text(GRID, [2.0, 1.8, 1.5, 1.3, 1.2, 1.1], [2.0, 1.8, 1.5, 1.0, 1.0, 1.0],
                                    H100)
    assert never.split("\n")[0].endswith("; in this run it never came.")
    assert never.split("\n")[1] == "always: never below 1.0 up to concurrency 128 in this run."


def test_the_sweep_plot_draws_both_policies_and_records_its_title(headlines):
    fig = pl.plot_threshold_sweep(GRID, [2.0, 1.6, 1.2, 1.05, 0.9, 0.8], [2.0, 1.6, 1.2, 1.0, 1.0, 1.0])
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines[:2]] == ["always", "threshold:16"]
    assert list(ax.lines[0].get_ydata()) == [2.0, 1.6, 1.2, 1.05, 0.9, 0.8] and ax.get_xscale() == "log"
    title = "always: 2.00x at c=1, 0.80x at c=128; threshold:16: 2.00x, 1.00x"
    assert ax.get_title() == title and headlines() == [title]


# -- the failure-modes lab --------------------------------------------------------------------------
def _steps(spiky=((10, 30, 0.5, 2000), (45, 24, 0.9, 3000))):
    """60 plain steps with 20 held and 8 decoding, some speculating: (index, held, duration s, catch-up)."""
    steps = [SimpleNamespace(num_held=20, num_decodes=8, spec_k=0, num_draft_catch_up_tokens=0,
                             duration_s=0.05, draft_time_s=0.0) for _ in range(60)]
    for i, held, duration, catch_up in spiky:
        steps[i] = SimpleNamespace(num_held=held, num_decodes=6, spec_k=4, num_draft_catch_up_tokens=catch_up,
                                   duration_s=duration, draft_time_s=duration - 0.1)
    steps[5].spec_k = 4  # speculated while 16 or fewer were held: not a thrash
    steps[5].num_held = 12
    return steps


def test_the_lab_table_counts_speculating_steps_and_the_largest_catch_up():
    rows = pl.lab_table({"old count": ({"tpot_p90_s": 0.0123, "throughput_tok_s": 1234.4}, _steps()),
                         "spec off": ({"tpot_p90_s": 0.01, "throughput_tok_s": 1500.0}, [])})
    assert rows[0] == {"c=32": "old count", "p90 TPOT ms": "12.30", "tok/s": "1234",
                       "steps that speculated": 3, "largest catch-up (tokens)": 3000}
    assert rows[1]["steps that speculated"] == 0 and rows[1]["largest catch-up (tokens)"] == 0


def test_the_thrash_plot_and_text_read_the_steps_above_the_threshold(headlines):
    old, off = {"tpot_p90_s": 0.015}, {"tpot_p90_s": 0.012}
    fig = pl.plot_thrash(_steps(), old, off)
    start, end = fig.axes
    assert len(start.collections[0].get_offsets()) == 2 and len(end.collections[0].get_offsets()) == 1
    assert [t.get_text() for t in end.texts] == ["catch-up 3000"]
    assert headlines() == ["The old count at c=32: 2 steps speculated while 24+ requests were held, the "
                           "draft catching up on up to 3000 tokens; p90 TPOT 15.00 ms against spec off's "
                           "12.00"]
    text = pl.thrash_text(_steps(), old, off)
    assert text.startswith("The slowest of those steps took 900 ms, 800 ms of it the draft catching up on "
                           "3000 tokens")
    assert "cost the run +25% on p90 TPOT" in text


# -- mistake 3 --------------------------------------------------------------------------------------
def _row(policy, goodput, done=10.0, met=4.0, tok_s=5000.0, json_len=1.5, step_s=0.02):
    return {"policy": policy, "goodput_rps": goodput, "request_throughput_rps": done,
            "throughput_tok_s": tok_s, "interactive_goodput_rps": met,
            "interactive_request_throughput_rps": 5.0,
            "split": {"step_s": step_s, "draft_s": 0.004, "rows_s": 0.002},
            "routes": {"json": {"mean_accepted_length": json_len, "tpot_p50_s": 0.01}}}


def test_the_goodput_plot_marks_the_best_policy(headlines):
    rows = [_row("never", 3.0), _row("always", 5.0), _row("lane", 4.0)]
    ax = pl.plot_policy_goodput(rows, 32).axes[0]
    colours = {tuple(p.get_facecolor()) for p in ax.patches}
    assert len(ax.patches) == 3 and len(colours) == 2  # one bar (always) in the best policy's colour
    assert headlines() == ["Concurrency 32: best is always (5.0 req/s); never 3.0, always 5.0, lane 4.0"]


def test_the_opt_out_text_says_whether_it_paid_at_each_load(headlines):
    always = _row("always", 5.0, tok_s=5000.0)
    opt = {32: {"always": always, "opted out": _row("out", 5.5, tok_s=5200.0, step_s=0.015)},
           128: {"always": always, "opted out": _row("out", 4.0, tok_s=4990.0)}}
    lines = pl.opt_out_text(opt).split("\n")
    assert len(lines) == 5
    assert lines[0].startswith("c=32: opting JSON out took a decode step from 20.00 to 15.00 ms")
    assert lines[0].endswith("fleet throughput +4.0%, goodput +10.0%.")
    assert lines[1].startswith("  It paid: every request's decode step got 25% shorter")
    assert "lost: 33% of their tokens per step." in lines[1]
    # -0.2% fleet throughput is not above the 1% the text asks of "it paid"
    assert lines[3].startswith("  It did not pay: every request's decode step got 0% shorter")
    assert lines[4] == headlines()[0]
    assert lines[4] == "The JSON opt-out: +4.0% fleet throughput at 32 requests, -0.2% at 128"


def test_the_goodput_policy_text_ranks_it_and_reads_its_slo_share():
    rows = [_row("never", 3.0, met=5.0), _row("goodput", 4.0, met=2.0, done=12.0), _row("always", 5.0)]
    text = pl.goodput_policy_text(rows)
    assert text.startswith("The goodput policy ranked 2 of 3.")
    assert "40% of its interactive requests met the SLOs, against 100% under never" in text
    assert "finished per second under goodput (12.0)" in text


def _poor(ngram_step_s=0.012, length=1.2):
    def run(step_s, rate, length):
        return {"acceptance_rate": rate, "mean_accepted_length": length, "mean_step_s": step_s}

    return {c: {"off": [run(0.010, None, None)] * 3, "ngram": [run(ngram_step_s, 0.1, length)] * 3}
            for c in (1, 8)}


@pytest.mark.parametrize("finding,words", [
    ("lower", "Speculation made the requests slower in every round"),
    ("noisy", "The rounds disagreed, so this run cannot tell a gain from a loss"),
    ("tie", "Speculation neither helped nor hurt measurably"),
    ("probably higher", "Speculation still came out ahead in every round"),
])
def test_the_poor_acceptance_verdict_follows_concurrency_8s_finding(finding, words, headlines):
    verdicts = {1: Verdict(0.8, 0.75, 0.85, "lower"), 8: Verdict(1.0, 0.97, 1.03, finding)}
    lines = pl.poor_acceptance_text(_poor(), verdicts).split("\n")
    assert lines[0].startswith("concurrency 1: acceptance rate 0.10, mean accepted length 1.20 tokens per "
                               "verify step; mean step 10 -> 12 ms; n-gram at an acceptance rate of 0.10, "
                               "concurrency 1: slower")
    assert lines[2].startswith("With few drafts accepted, each step was 1.20x as long at concurrency 8. "
                               + words)
    assert len(lines) == 3
    assert len(headlines()) == 2


def test_a_clear_gain_is_checked_against_what_the_step_split_allows():
    # 1.5 tokens per verify over steps 1.2x as long allow at most 1.25x, give or take the 5% dead zone
    explained = {1: Verdict(1.2, 1.1, 1.3, "higher"), 8: Verdict(1.3, 1.2, 1.35, "higher")}
    assert pl.poor_acceptance_text(_poor(length=1.5), explained).count("is no accident") == 2
    too_big = {1: Verdict(0.8, 0.75, 0.85, "lower"), 8: Verdict(1.5, 1.4, 1.6, "higher")}
    last = pl.poor_acceptance_text(_poor(length=1.5), too_big).split("\n")[-1]
    assert last.startswith("The gain at concurrency 8 (1.50x (1.40-1.60 over the rounds)) is more than")
    assert "allow (1.25x)" in last


# -- the premium lane -------------------------------------------------------------------------------
def _scenario_run(tpot_s, bulk_tok_s, draft_s=0.003, share=0.5):
    return {"lanes": {"interactive": {"tpot_p50_s": tpot_s}, "bulk": {"throughput_tok_s": bulk_tok_s}},
            "split": {"step_s": 0.02, "draft_s": draft_s, "rows_s": 0.001, "num_draft_rows": 4.0,
                      "rest_s": 0.015, "cause": "the drafter's sequential forwards",
                      "no_draft_loop_share": share}}


def test_a_premium_lane_pays_only_when_both_goals_are_met():
    plain = _scenario_run(0.010, 1000.0)
    assert pl.lane_verdict(plain, _scenario_run(0.005, 950.0)) == (2.0, 0.95, True)
    assert pl.lane_verdict(plain, _scenario_run(0.005, 850.0))[2] is False  # the bulk lane lost 15%
    assert pl.lane_verdict(plain, _scenario_run(0.008, 990.0))[2] is False  # premium only 1.25x faster


def test_the_premium_lane_text_and_plot_per_drafter(headlines):
    plain = _scenario_run(0.010, 1000.0)
    premium = {"llama-3.2-1b": _scenario_run(0.005, 850.0, draft_s=0.008),
               "ngram": _scenario_run(0.005, 950.0, draft_s=0.0, share=1)}
    lines = pl.premium_lane_text(plain, premium).split("\n")
    assert lines[0] == "spec off: premium p50 TPOT 10.00 ms, bulk 1000 tok/s, decode step 20.00 ms"
    assert lines[1].startswith(" llama-3.2-1b: premium p50 TPOT 2.00x lower, bulk throughput 0.85 of spec "
                               "off's: does not pay. Per decode step the bulk requests waited 8.00 ms")
    assert lines[1].endswith("50% of the decode steps ran no draft loop (no premium request drafted in "
                             "them).")
    assert lines[2].startswith("        ngram: premium p50 TPOT 2.00x lower") and ": pays." in lines[2]
    assert lines[2].endswith("n-gram lookup runs no draft forward at all.")
    ax = pl.plot_lane_verdicts(plain, premium).axes[0]
    assert sorted(round(p.get_height(), 2) for p in ax.patches) == [0.85, 0.95, 2.0, 2.0]
    assert headlines() == ["15% premium lane at c=32: pays with ngram; llama-3.2-1b bulk 0.85"]


def test_the_draft_wait_text_prices_four_fixed_draft_forwards():
    text = pl.draft_wait_text({"draft_s": 0.0081}, H100)
    assert text.startswith("The 1B draft's four forwards each pay the engine's fixed 1.50 ms per draft "
                           "forward, 6.00 ms of the 8.10 ms the bulk lane waited per step for them, on top "
                           "of the 2.00 ms")


def _added(spec_step_s):
    plain = {"step_s": 0.020, "draft_s": 0.0, "target_s": 0.015, "other_s": 0.005}
    spec = {"step_s": spec_step_s, "draft_s": 0.001, "target_s": spec_step_s - 0.006, "other_s": 0.005}
    return neighbour_cost(plain, spec)


def test_the_premium_lane_here_explains_a_miss_and_flags_a_close_call(headlines):
    paid = pl.premium_here_text(2.0, 1.0, _added(0.021)).split("\n")
    assert paid[0].endswith("bulk keeps 1.00 of its all-plain token rate: pays.") and len(paid) == 2
    assert paid[1].startswith("What the bulk requests waited for: a decode step took 20.00 -> 21.00 ms")
    missed = pl.premium_here_text(1.1, 0.8, _added(0.025)).split("\n")
    assert missed[0].endswith("misses the goal (1.3x, 0.9).")
    assert missed[2].startswith("Why it misses here: the premium request gained only 1.10x")
    assert "; the bulk lane paid +25% per step, mostly the verify rows in the target's forward." in missed[2]
    assert missed[3].startswith("Read this verdict as close: one run of each, and the premium gain sits near")
    close = pl.premium_here_text(2.0, 0.88, _added(0.022)).split("\n")
    assert close[-1].startswith("Read this verdict as close: one run of each, and the bulk share sits near")
    assert "Why it misses here: the bulk lane paid" in close[2]
    assert len(headlines()) == 3


# -- the JSON route ---------------------------------------------------------------------------------
def _json_run(alpha, step_s=0.04, grammar_s=0.001, forced=None, valid=4):
    spec = alpha is not None
    return {"alpha": alpha, "mean_accepted_length": 2.0 if spec else None, "forced_per_verify_step": forced,
            "step_s": step_s, "draft_s": 0.01 if spec else 0.0, "target_s": 0.03, "grammar_s": grammar_s,
            "num_valid_json": valid}


JSON_RUNS = {("spec off", "free"): [_json_run(None)] * 2,
             ("spec off", "grammar"): [_json_run(None, step_s=0.02), _json_run(None, step_s=0.04)],
             ("n-gram", "free"): [_json_run(0.3)] * 2, ("n-gram", "grammar"): [_json_run(0.5)] * 2,
             ("n-gram", "grammar+jump"): [_json_run(0.6, forced=0.75)] * 2}
JSON_TPUTS = {cell: [100.0, 100.0] for cell in JSON_RUNS} | {("n-gram", "grammar+jump"): [120.0, 130.0]}


def test_median_of_runs_takes_the_upper_middle_and_none_without_a_verify():
    assert pl.median_of_runs([{"x": 3.0}, {"x": 1.0}, {"x": 2.0}, {"x": 4.0}], "x") == 3.0
    assert pl.median_of_runs([{"alpha": None}, {"alpha": 0.5}], "alpha") is None


def test_the_json_table_and_the_grammar_share():
    rows = pl.json_route_table(JSON_RUNS, JSON_TPUTS, 6)
    assert [(r["drafter"], r["arm"]) for r in rows] == list(JSON_RUNS)
    assert rows[0]["alpha"] == rows[0]["tokens / verify"] == "-" and rows[4]["forced / verify"] == "0.75"
    assert rows[1]["step ms (draft / target / grammar)"] == "40 (0 / 30 / 1.0)"  # the upper of two middles
    assert rows[4]["tok/s"] == "130" and rows[4]["valid JSON"] == "4/6"
    share = pl.grammar_share_text(JSON_RUNS, 4)
    assert share == "The grammar's masks took 2.5% of a spec-off decode step at concurrency 4."


@pytest.mark.parametrize("verdict,words", [
    (Verdict(1.25, 1.2, 1.3, "higher"),
     "With n-gram: the notes' advice does not hold here. Under the grammar (grammar+jump) speculation beat "
     "spec off in every round (1.25x"),
    (Verdict(0.97, 0.96, 0.98, "probably lower"),
     "With n-gram: the notes' advice holds here. Even at its best (grammar+jump) speculation on the JSON "
     "route measured 0.97x"),
    (Verdict(1.0, 0.98, 1.02, "tie"),
     "With n-gram: no clear gain either way on this run (best, grammar+jump: no measurable difference"),
])
def test_the_json_verdict_judges_the_faster_grammar_arm(verdict, words, headlines):
    verdicts = {("n-gram", "grammar"): Verdict(0.8, 0.7, 0.9, "lower"), ("n-gram", "grammar+jump"): verdict}
    lines = pl.json_verdict_text(verdicts, JSON_RUNS, JSON_TPUTS).split("\n")
    assert lines[0] == ("JSON route, n-gram, grammar: slower: 0.80x (0.70-0.90 over the rounds). Each verify "
                        "emitted 2.00 tokens, the step grew 1.00x (the drafter 25% of it): the split predicts "
                        "about 2.00x against 0.80x measured, more than 5% apart; they disagree on the direction. "
                        "Tokens per verify leave the prefill steps and the run's tail out, tokens/s does not, so "
                        "trust the measured ratio.")
    assert lines[2] == ("n-gram: the grammar moved alpha from 0.30 (free) to 0.50; jump-forward added 0.75 "
                        "forced drafts per verify step.")
    assert lines[3].startswith(words) and len(lines) == 4
    assert headlines()[0] == "JSON route, n-gram, grammar: slower: 0.80x (0.70-0.90 over the rounds)"
