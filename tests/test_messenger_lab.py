"""Notebooks 05 and 06's helpers (course/messenger_lab.py and the modules it gathers) on hand-made
runs: the verdict sentences they choose, the curves they select, and each report drawing without
error."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from course import messenger_lab as lab  # noqa: E402
from course.gpu import load_gpu_results  # noqa: E402
from course.noise import compare  # noqa: E402


class FakeArms(lab.LiveArms):
    """LiveArms without engines: rounds of tokens/s and per-round summaries given by hand."""

    def __init__(self, tok_s: dict, base: dict, runs: dict, rounds: int = 3):
        self.base, self.tok_s, self.runs, self.rounds = base, tok_s, runs, rounds
        self.concurrency = sorted(tok_s)
        self.verdict = {(n, c): compare(tok_s[c][n], tok_s[c][b]) for n, b in base.items() for c in tok_s}


def summary(rate=0.5, length=2.5, share=0.2):
    return {"acceptance_rate": rate, "mean_accepted_length": length, "draft_time_share": share,
            "target_time_s": 1.0, "num_steps": 10}


def arms(fast_lo, fast_hi, rate=0.5, length=2.5):
    tok_s = {1: {"off": [10.0, 10.0, 10.0], "spec": fast_lo}, 4: {"off": [20.0, 20.0, 20.0], "spec": fast_hi}}
    runs = {(n, c): [summary(rate, length)] * 3 for n in ("off", "spec") for c in (1, 4)}
    return FakeArms(tok_s, {"spec": "off"}, runs)


def test_verdict_notes_say_the_speedup_shrank_only_when_both_loads_are_clear():
    assert lab.verdict_notes(arms([20.0, 21.0, 19.0], [22.0, 23.0, 24.0]), "spec") == [
        "  The rounds agree at both loads: the speedup shrank from c=1 to c=4."]
    notes = lab.verdict_notes(arms([20.0, 21.0, 19.0], [15.0, 25.0, 21.0]), "spec")  # c=4 disagrees
    assert len(notes) == 1 and notes[0].startswith("  At c=4 the rounds disagreed on the direction")


def test_verdict_notes_blame_a_busy_machine_for_a_loss_with_long_accepted_runs():
    notes = lab.verdict_notes(arms([5.0, 6.0, 5.5], [5.0, 6.0, 5.5], length=3.0), "spec")
    assert any("a busy machine is the likely cause" in n for n in notes)
    notes = lab.verdict_notes(arms([5.0, 6.0, 5.5], [5.0, 6.0, 5.5], length=1.2), "spec")
    assert not any("busy machine" in n for n in notes)


@pytest.mark.parametrize("name, rate, words", [("spec", 0.5, None), ("spec", 0.1, "sits inside the noise"),
                                               ("tree", 0.1, "read its mean accepted length")])
def test_caveat_depends_on_acceptance_and_shape(name, rate, words):
    live = arms([20.0] * 3, [20.0] * 3, rate=rate)
    live.runs[(name, 1)] = [summary(rate)] * 3
    text = live.caveat(name, 1)
    assert (text == "") if words is None else (words in text)


def test_cached_curve_picks_the_chain_or_the_tree_by_node_count():
    rows = [{"prompts": "chat", "spec": "draft", "k": 4, "num_draft_tokens": 8, "concurrency": 2, "speedup_vs_off": 1.1},
            {"prompts": "chat", "spec": "draft", "k": 4, "num_draft_tokens": None, "concurrency": 1,
             "speedup_vs_off": 1.3, "speedup_range": [1.2, 1.4]},
            {"prompts": "copy", "spec": "draft", "k": 4, "concurrency": 1, "speedup_vs_off": 9.9}]
    assert lab.cached_curve(rows, "chat", "draft", 4) == [(1, 1.3, 1.2, 1.4)]
    assert lab.cached_curve(rows, "chat", "draft", 4, 8) == [(2, 1.1, 1.1, 1.1)]


def test_losing_from_needs_every_later_point_below_one():
    rows = [{"arm": "a", "concurrency": c, "speedup": s} for c, s in ((1, 1.5), (8, 0.9), (32, 1.1), (64, 0.8))]
    assert lab.losing_from(rows, "a") == 64
    assert lab.losing_from([{"arm": "a", "concurrency": 1, "speedup": 1.2}], "a") is None


def test_draft_cost_ranks_the_tree_only_when_the_rounds_settle_it(capsys):
    tok_s = {1: {"off": [10.0] * 3, "chain": [15.0, 15.5, 14.5], "tree": [12.0, 12.5, 11.5]}}
    runs = {(n, 1): [summary()] * 3 for n in ("off", "chain", "tree")}
    live = FakeArms(tok_s, {"chain": "off", "tree": "off"}, runs)
    live.base = {"chat: chain": "off", "chat: tree": "off"}
    live.tok_s[1]["chat: chain"], live.tok_s[1]["chat: tree"] = tok_s[1]["chain"], tok_s[1]["tree"]
    live.runs.update({("chat: chain", 1): runs[("chain", 1)], ("chat: tree", 1): runs[("tree", 1)]})
    live.verdict = {(n, 1): compare(live.tok_s[1][n], tok_s[1]["off"]) for n in live.base}
    lab.report_draft_cost(live, "chat: chain", "chat: tree")
    assert "and still gained less" in capsys.readouterr().out
    live.tok_s[1]["chat: tree"] = [16.0, 14.0, 15.2]  # the rounds disagree
    lab.report_draft_cost(live, "chat: chain", "chat: tree")
    assert "does not say which gains more" in capsys.readouterr().out


def test_neighbours_report_never_prints_minus_zero(capsys):
    def run(step, draft, target):
        lanes = {lane: {"tpot_p50_s": step} for lane in ("bulk", "interactive")}
        return {**lanes, "steps": {"step_s": step, "draft_s": draft, "target_s": target,
                                   "other_s": step - draft - target}}
    places = (("here (n-gram)", {"plain": run(0.100, 0.0, 0.09), "speculating": run(0.150, -0.00004, 0.14)}),)
    lab.report_neighbours(places)
    out = capsys.readouterr().out
    assert "-0.0 ms" not in out and "the draft's forwards added 0.0 ms" in out
    assert "Most of the slowdown came from the wider verify" in out


def test_the_gpu_report_reads_the_committed_run(capsys):
    lab.report_gpu_crossover(load_gpu_results("h200"))
    out = capsys.readouterr().out
    assert "At c=32, where the notes' 2x demo becomes 1.1x or 0.9x:" in out
    assert "k = 4 drafts cost" in out and "ms per request in each draft forward" in out


def test_the_sim_reports_run_on_a_small_sweep(capsys):
    grid = [1, 32, 128]
    curve = lambda s1: dict(zip(grid, (s1, 1.0, 0.9)))
    speedup = {("h100", 0.8): curve(1.8), ("h100", 0.3): curve(0.8), ("h200", 0.8): curve(1.7)}
    lab.report_sim_crossover(speedup, {("h100", 0.8): 128, ("h100", 0.3): 1, ("h200", 0.8): None}, grid)
    out = capsys.readouterr().out
    assert "loses ground between c=1 and c=32 on both devices, from 1.70-1.80x" in out
    # the lines read the crossover the notebook computed, not one of their own
    assert "h100 alpha 0.3: 0.80x at c=1" in out and "below 1.0 from c=1." in out
    assert "h200 alpha 0.8: 1.70x at c=1, 1.00x at c=32, 0.90x at c=128; never below 1.0" in out
    rows_q = {fmt: [{"spec": "off", "concurrency": c, "throughput_tok_s": t} for c in (1, 128)]
              + [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in ((1, s1), (128, 0.9))]
              for fmt, t, s1 in (("bfloat16", 100.0, 1.8), ("fp8", 160.0, 1.5))}
    lab.report_quantized_crossover(rows_q)
    assert "fp8 makes spec off 1.60x faster at c=1" in capsys.readouterr().out


def test_the_summary_lines_wrap_at_spaces_in_a_notebook(capsys):
    """A padded name ("n-gram k 4   too noisy") made WrappedOutput take the line for a table row and
    leave it whole, so JupyterLab broke it mid-word (issue 44, item 9)."""
    from course import WrappedOutput

    arms([20.0, 21.0, 19.0], [15.0, 25.0, 21.0]).print_summary()
    lines = capsys.readouterr().out.splitlines()
    assert lines and all("   " not in line for line in lines)
    wrapped = WrappedOutput(type("S", (), {"write": lambda self, t: None, "flush": lambda self: None})(), width=60)
    assert all(len(part) <= 60 for line in lines for part in wrapped._fit(line).splitlines())


def test_gpu_thresholds_follow_the_exercise_rule_on_the_committed_run(capsys):
    from course.exercises import reference_threshold
    from course.gpu import crossover_rows

    gpu = load_gpu_results("h200")
    out = lab.gpu_thresholds(gpu)
    rows = crossover_rows(gpu)
    for arm, (measured, _) in out.items():
        mine = [{"spec": arm, "concurrency": r["concurrency"], "speedup_vs_off": r["speedup"]}
                for r in rows if r["arm"] == arm]
        assert measured == reference_threshold(mine, arm)
        first_loss = next((r["concurrency"] for r in mine if r["speedup_vs_off"] < 1.0), None)
        assert first_loss is None or measured < first_loss
    assert "one wave per point" in capsys.readouterr().out


def test_notebook_07s_sentence_on_the_gpu_thresholds_holds_for_the_committed_run():
    """07 says the real 1B draft wants a threshold of a few requests while free drafts at the same
    acceptance keep paying to 128: true of the committed run, or this fails before a learner reads it."""
    out = lab.gpu_thresholds(load_gpu_results("h200"))
    assert out["1B draft a=0.8"][0] <= 4 and out["synthetic a=0.8"][0] == 128


def test_the_explorers_title_is_true_to_every_point():
    """Issue 57, item 8: 05's explorer said "below 1.0 from c=64" while c=128 read 1.01x."""
    from course.plots import below_one_text

    cs = [1, 8, 32, 64, 128]
    assert below_one_text(cs, [1.4, 1.2, 1.05, 0.97, 1.01]) == "below 1.0 at c=64 only"
    assert below_one_text(cs, [1.4, 1.2, 0.99, 0.97, 0.9]) == "below 1.0 from c=32"
    assert below_one_text(cs, [1.4, 1.2, 1.1, 1.05, 1.01]) == "never below 1.0 here"


def test_formats_verdicts_label_an_emulated_format_and_time_bfloat16_in_a_box():
    """Issue 56, item 2 (course/formats.py, notebooks 01 and 06): a format this CPU emulates is named
    as emulated beside its numbers, and a native one is not; bfloat16 without native instructions is
    timed in a box, not drawn; an unavailable format is left out."""
    from course.formats import emulated_line, formats_here, messenger_verdict

    why = "emulated: its activations are bfloat16, and this CPU has no AVX512-BF16 or AMX"
    off, spec = [20.0, 21.0, 20.5], [10.0, 10.5, 10.2]
    result = {"float32": {"off_ms": off, "spec_ms": spec, "speedup": compare(off, spec), "acceptance_rate": 0.6},
              "int4": {"off_ms": [12.0] * 3, "spec_ms": [11.0] * 3, "speedup": compare([12.0] * 3, [11.0] * 3),
                       "acceptance_rate": 0.6}}
    labelled = messenger_verdict(result, k=4, support={"float32": "native", "int4": why})
    assert labelled.count("runs emulated on this CPU") == 1 and "int4 runs emulated" in labelled
    assert "runs emulated" not in messenger_verdict(result, k=4, support={"float32": "native", "int4": "native"})
    assert "runs emulated" not in messenger_verdict(result, k=4)
    native = {"float32": "native", "bfloat16": "native", "int8": "native", "int4": "native"}
    assert formats_here(native) == (["float32", "bfloat16", "int8", "int4"], [])
    laptop = {"float32": "native", "bfloat16": "emulated: no AVX512-BF16", "int8": why, "int4": why}
    assert formats_here(laptop) == (["float32", "int8", "int4"], ["bfloat16"])
    bare = {**laptop, "int8": "unavailable: needs AVX2", "int4": "unavailable: needs AVX2"}
    assert formats_here(bare) == (["float32"], ["bfloat16"])
    line = emulated_line("bfloat16", "emulated through float32", one_ms=90.0, float32_ms=30.0, bytes_ratio=0.5)
    assert "0.33x float32's speed" in line and "the emulation, not the memory" in line
