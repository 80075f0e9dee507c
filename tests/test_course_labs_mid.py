"""Notebooks 03 and 04's helpers (course/chunking_lab.py, course/spec_lab.py):
the arrival run on a tiny model, and each verdict sentence chosen for hand-made measurements, so a
sentence the notebook prints is the one its numbers call for. Plots are drawn headless (Agg)."""

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from conftest import tiny_config
from course import chunking_lab as cl
from course import spec_lab as sl
from course.exercises import expected_tokens_per_step
from course.noise import Verdict
from minispec.models.llama import LlamaModel


@pytest.fixture(autouse=True)
def headless_figures():
    """Draw on Agg (no window), and close every figure a test drew."""
    matplotlib.use("Agg")
    yield
    plt.close("all")


def title(ax) -> str:
    """An axes' title with its line breaks as spaces (``fit_titles`` may have wrapped it)."""
    return " ".join(ax.get_title().split())


def arrival(budget, itl_p99_s=0.05, ttft_s=1.0, series=(0.02, 0.02, 0.03, 0.5), rate=0.5, timeline=()):
    """A hand-made run_arrival result."""
    return {"budget": budget, "itl_p99_s": itl_p99_s, "itl_max_s": max(series), "newcomer_ttft_s": ttft_s,
            "tpot_p50_s": 0.03, "acceptance_rate": rate, "itl_series": list(series), "timeline": list(timeline)}


# ---- chunking_lab (notebook 03)

def test_the_arrival_run_prefills_the_long_prompt_in_one_step_or_in_chunks_within_the_budget():
    model = LlamaModel.random(tiny_config(max_position_embeddings=4096), seed=0)
    long_prompt = list(range(5, 205))
    results = {}
    for chunked in (False, True):
        engine = cl.run_arrival(model, None, [[1, 2, 3, 4]] * 3, long_prompt, 64, chunked=chunked,
                                decode_tokens=12, arrive_after_steps=2)
        results[chunked] = r = engine.result
        assert len(r["itl_series"]) == len(r["timeline"])
        assert r["acceptance_rate"] is None  # spec off: no drafts
        assert r["itl_max_s"] >= r["itl_p99_s"] > 0 and r["newcomer_ttft_s"] > 0

    def chunks(r):  # the long prompt's prefill chunks: the decoders' prompts were all prefilled in step 0
        return [n for step in r["timeline"][2:] for _, kind, n in step if kind == "prefill"]

    assert results[False]["budget"] == "no chunking" and chunks(results[False]) == [200]
    assert results[True]["budget"] == 64 and sum(chunks(results[True])) == 200
    assert max(chunks(results[True])) <= 64 and len(chunks(results[True])) >= 4


def test_arrival_lines_compare_the_one_shot_step_with_the_median_step():
    unchunked = arrival("no chunking", series=(0.02, 0.02, 0.03, 0.02, 0.6))
    chunked = arrival(256, series=(0.02, 0.05, 0.04))
    lines = cl.arrival_lines(unchunked, chunked, prompt_tokens=1200)
    assert lines[0].startswith(" no chunking: decoders' p99 ITL")
    assert lines[1].startswith("         256:")
    assert lines[2] == ("Without chunking, the step that carried the 1200-token prompt took 600 ms, 30x the median "
                        "step (20 ms); with budget 256 the longest step took 50 ms.")


@pytest.mark.parametrize("itl_rises, ttft_falls", [(True, True), (True, False), (False, True)])
def test_the_budget_sweep_names_the_trade_off_only_where_the_run_shows_it(itl_rises, ttft_falls):
    budgets = [64, 128, 512]
    itl = [0.01, 0.02, 0.04] if itl_rises else [0.04, 0.02, 0.03]
    ttft = [3.0, 2.0, 1.0] if ttft_falls else [3.0, 1.0, 2.0]
    runs = {b: arrival(b, itl_p99_s=i, ttft_s=t) for b, i, t in zip(budgets, itl, ttft)}
    itl_line, ttft_line, trade_line = cl.budget_sweep_lines(runs, budgets)
    if itl_rises:
        assert itl_line == "The budget of 64 kept the decoders' p99 ITL 4.0x lower than 512 did."
    else:
        assert itl_line.startswith("The smallest budget did not give a clearly lower p99 ITL")
    if ttft_falls:
        assert ttft_line.startswith("The newcomer's TTFT fell as the budget grew (3.00 -> 1.00 s)")
    else:
        assert ttft_line.startswith("The newcomer's TTFT was lowest at a budget of 128 (1.00 s) and rose again")
    if itl_rises and ttft_falls:
        assert trade_line == "Up to 512 every smaller budget gave a lower p99 ITL and a longer TTFT: the trade-off held at each step."
    else:  # the trade-off breaks somewhere, and the line says where instead of claiming it holds
        assert "held at each step" not in trade_line
    ax = cl.plot_budget_sweep(runs, budgets)
    assert title(ax).startswith("Budget 64 -> 512: TTFT 3.00 -> ")
    assert [t.get_text() for t in ax.texts] == ["64", "128", "512"]


def verify_steps(num_verify, num_mixed):
    """A timeline with ``num_verify`` steps carrying verify positions, ``num_mixed`` of them with a prompt chunk."""
    return ([[("a", "verify", 5), ("b", "prefill", 100)]] * num_mixed
            + [[("a", "verify", 5)]] * (num_verify - num_mixed) + [[("a", "decode", 1)]])


@pytest.mark.parametrize("finding, rate, expected", [
    ("noisy", 0.5, "The rounds disagreed on the direction"),
    ("higher", 0.1, "Every round agreed, but read it with care: at an acceptance rate of 0.10"),
    ("higher", 0.5, "Speculation sped up the decoders on top of chunking in every round (1.20x (1.10-1.30"),
    ("tie", 0.5, "About the same TPOT: at an acceptance rate of 0.50"),
    ("lower", 0.5, "Here speculation slowed the decoders down"),
    ("probably lower", 0.5, "Here speculation slowed the decoders down"),
    ("higher", None, "n-gram found no repeated text to draft from"),
])
def test_speculation_on_chunking_reads_the_verdict_and_the_acceptance_rate(finding, rate, expected):
    runs = [arrival(256, rate=rate), arrival(256, rate=None), arrival(256, rate=rate, timeline=verify_steps(5, 2))]
    verdict = Verdict(1.2, 1.1, 1.3, finding)
    lines = cl.speculation_on_chunking_lines(runs, {"off": [0.05, 0.06, 0.04], "ngram": [0.03, 0.05, 0.04]},
                                             verdict, k=4)
    assert len(lines) == 4
    assert "5 steps with verify positions, 2 of them also carrying a prompt chunk" in lines[0]
    acceptance = "no drafts proposed" if rate is None else f"acceptance rate {rate:.2f}"
    assert lines[1] == (f"decoders' p50 TPOT, median of 3 rounds: 40 ms with n-gram speculation ({acceptance}), "
                        "50 ms without.")
    assert lines[2].startswith("Speculation on top of chunking, decoders' speed: ")
    assert lines[3].startswith(expected)


def test_the_low_acceptance_caveat_states_the_verify_cost_the_gain_needs():
    runs = [arrival(256, rate=0.1)]
    line = cl.speculation_on_chunking_lines(runs, {"off": [0.05], "ngram": [0.04]}, Verdict(1.25, 1.2, 1.3, "higher"),
                                            k=4)[3]
    assert "1 + 0.10 x 4 = 1.40 tokens" in line and "cost only 1.12 plain steps" in line


def grid(values):
    """A hand-made chunking_and_speculation result: (p50 TPOT, worst ITL) per combination, in COMBINATIONS order."""
    return {key: {"tpot_p50_s": t, "itl_max_s": m} for key, (t, m) in zip(cl.COMBINATIONS, values)}


def test_one_measured_run_ranks_the_worst_gaps_only_by_a_clear_margin():
    close = grid([(0.05, 2.0), (0.05, 0.30), (0.03, 2.1), (0.03, 0.31)])
    apart = grid([(0.05, 2.0), (0.05, 0.30), (0.03, 2.1), (0.03, 0.9)])
    assert cl.worst_gap_text(close, exact=False) == "chunking and both within 3.3%: one run cannot rank them"
    assert cl.worst_gap_text(close, exact=True) == "smallest worst gap: chunking"
    assert cl.worst_gap_text(apart, exact=False) == "smallest worst gap: chunking"
    fig = cl.plot_combinations([("here", close, False), ("H100 model", apart, True)])
    titles = [title(ax) for ax in fig.axes]
    assert titles[0].endswith("one run cannot rank them") and titles[1].endswith("smallest worst gap: chunking")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["neither", "chunking", "speculation", "both"]


def test_combination_lines_note_the_draft_catch_up_only_where_speculation_grew_the_worst_gap():
    lines = cl.combination_lines([("here", grid([(0.05, 2.0), (0.05, 0.25), (0.03, 2.1), (0.03, 0.3)])),
                                  ("on the H100 model", grid([(0.05, 2.0), (0.05, 0.25), (0.03, 2.1), (0.03, 0.5)]))])
    assert len(lines) == 3
    assert lines[0] == ("here: chunking cut the worst decoder gap 8.0x (2000 -> 250 ms); speculation took p50 TPOT "
                        "from 50.0 to 30.0 ms; both together: TPOT 30.0 ms, worst gap 300 ms.")
    assert lines[1].startswith("on the H100 model:") and lines[2].startswith("  With speculation the worst gap")


# ---- spec_lab (notebook 04)

def test_the_alpha_sweep_names_its_largest_gap_and_explains_it_past_five_percent():
    alphas, k = [0.2, 0.5, 0.8], 4
    exact = [expected_tokens_per_step(a, k) for a in alphas]
    assert sl.alpha_sweep_lines(alphas, exact, [100, 100, 100], k) == [
        f"Largest gap between measurement and formula: +0.0% at alpha 0.2 ({exact[0]:.2f} measured, "
        f"{exact[0]:.2f} predicted, over 100 verify steps)."]
    low = [exact[0], exact[1] * 0.9, exact[2] * 0.98]
    lines = sl.alpha_sweep_lines(alphas, low, [100, 80, 60], k)
    assert lines[0].startswith("Largest gap between measurement and formula: -10.0% at alpha 0.5")
    assert "over 80 verify steps" in lines[0] and lines[1].startswith("More than 5%")
    ax = sl.plot_alpha_sweep(alphas, low, k)
    assert title(ax).endswith("largest gap to the formula -10.0%")
    assert ax.get_ylabel() == "mean accepted length (tokens/step, k = 4)"


def test_total_variation_is_zero_for_equal_and_one_for_disjoint_distributions():
    a, b = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    assert sl.total_variation(a, a) == 0.0
    assert sl.total_variation(a, b) == pytest.approx(1.0)


def test_rejection_sampling_lines_tell_the_target_from_the_draft():
    target = torch.tensor([0.1, 0.6, 0.3])
    draft = torch.tensor([0.6, 0.2, 0.2])
    on_target = sl.emitted_probs_lines(draft, target, target.clone(), num_accepted=500, n=1000)
    assert on_target[0] == ("Acceptance rate 0.500 over 1000 single-draft steps; the overlap "
                            "sum(min(target_probs, draft_probs)) predicts 0.500.")
    assert on_target[1].startswith("Distance of the emitted tokens from target_probs: 0.000;")
    assert on_target[2].startswith("Within sampling noise of the target")
    on_draft = sl.emitted_probs_lines(draft, target, draft.clone(), num_accepted=500, n=1000)
    assert on_draft[2].startswith("That is more than sampling noise explains")
    ax = sl.plot_emitted_probs(draft, target, draft.clone())
    assert title(ax).startswith("Emitted tokens lie 0.500 from target_probs and 0.000 from draft_probs")
    assert len(ax.patches) == 9  # three bars per token


def k_row(spec, k, tok_s, rate=0.5, tokens=2.0, draft_time_s=0.1, target_time_s=1.0):
    """A hand-made bench_rows row at concurrency 1."""
    off = spec == "off"
    return {"spec": spec, "k": k, "throughput_tok_s": tok_s, "acceptance_rate": None if off else rate,
            "mean_accepted_length": None if off else tokens, "draft_time_s": draft_time_s,
            "target_time_s": target_time_s, "speedup_vs_off": 1.0}


def k_sweep(ngram, draft, off=(10.0, 10.0, 10.0), **kw):
    rows = []
    for k, o, n, d in zip((2, 4, 8), off, ngram, draft):
        rows += [k_row("off", k, o), k_row("ngram", k, n, **kw), k_row("draft", k, d, **kw)]
    return sl.KSweep(rows)


def test_the_k_sweep_takes_each_speedup_against_the_median_spec_off_run():
    sweep = k_sweep([12.0, 15.0, 11.0], [9.0, 8.0, 7.0], off=(9.0, 10.0, 12.0))
    assert sweep.noise == pytest.approx(12 / 9 - 1) and sweep.margin == sweep.noise
    assert [r["speedup_vs_off"] for r in sweep.by_method["ngram"]] == pytest.approx([1.2, 1.5, 1.1])
    assert sweep.best("ngram")["k"] == 4 and sweep.best("draft")["k"] == 2
    assert sweep.caption().endswith("against the median of the 3 spec-off runs")
    table = sweep.table()
    assert table[0] == {"k": 2, "drafter": "off", "tok/s": "9.0", "acceptance rate": "-", "tokens / verify": "-",
                        "vs median spec off": "-"}
    assert table[1]["vs median spec off"] == "1.20x" and table[1]["acceptance rate"] == "0.50"
    assert sweep.noise_text() == ("The 3 spec-off runs of the same prompts spread 33% in tokens/s: a speedup within "
                                  "33% of 1.0 is read as breaking even, not as a finding.")


def test_the_best_k_is_named_only_past_the_noise():
    sweep = k_sweep([15.0, 11.0, 10.0], [10.5, 11.0, 10.8])  # margin 10%: spec-off runs agree
    assert sweep.best_k_text("ngram") == "best ngram 1.50x (k=2)"
    assert sweep.best_k_text("draft") == "draft 1.10x at k=4, k=8 within the noise (1.08x): best k not settled"
    ax = sl.plot_k_sweep(sweep)
    assert "best ngram 1.50x (k=2)" in title(ax) and title(ax).endswith("spread 0%")
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["ngram", "draft"]


@pytest.mark.parametrize("tok_s, kw, expected", [
    (15.0, {}, "It wins: 1.00 extra tokens per step against 0.33 extra steps of cost."),
    (10.2, {}, "It about breaks even (within 10%)"),
    (7.0, {}, "It loses"),
    (15.0, {"rate": 0.1}, "It looks like a win, but at an acceptance rate under 0.2 it is too noisy"),
    (10.6, {}, "1.06x sits within 0.05 of the 1.10x line"),
    (25.0, {}, "C below 1 means the spec-off run was slowed"),
    (8.0, {"tokens": 2.5, "draft_time_s": 0.01}, "with an almost free drafter and still losing"),
    (10.2, {"draft_time_s": 0.25, "target_time_s": 0.75}, "The drafter's own work took 25% of the compute time"),
])
def test_each_k_sweep_verdict_matches_its_measured_case(tok_s, kw, expected):
    sweep = k_sweep([tok_s, 1.0, 1.0], [1.0, 1.0, 1.0], **kw)
    text = sweep.verdict(sweep.best("ngram"))
    assert text.startswith("ngram at k=2: acceptance rate") and text.endswith(".")
    assert expected in text
    if tok_s == 15.0 and not kw:
        assert text.count(". ") == 1  # a clear win needs no caveat
