"""The helpers behind notebooks 00-02's measurement cells (course/quickstart_lab.py,
roofline_lab.py, batching_lab.py): each verdict sentence is chosen for the case it names, the plots
draw on tiny inputs, and the timed engines and the static run work on a tiny random model."""

from types import SimpleNamespace

import matplotlib
import matplotlib.pyplot as plt
import pytest

from conftest import tiny_config, tiny_engine
from course.batching_lab import (concurrency_lines, load_verdict, plot_load_rounds, run_static_batches,
                                          static_vs_continuous_text)
from course.noise import compare, round_median
from course.quickstart_lab import (plot_step_times, slow_steps_note, step_time_title,
                                            step_time_verdict)
from course.roofline_lab import (chunk_stepper, decode_stepper, flat_up_to, measured_title,
                                          plot_measured_steps, plot_modelled_steps, step_curve_verdict)
from minispec.tools.summary import StepLog
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.sim import CostModel, load_hardware, load_model_spec


@pytest.fixture(autouse=True)
def headless_figures():
    """Draw off screen, and close what a test drew."""
    matplotlib.use("Agg")
    yield
    plt.close("all")


# ---- notebook 00: step time against tokens in the step ------------------------------------------

TOKENS = [1, 1, 2, 2, 16, 16, 32, 32]  # quarters of two steps: medians 1 and 32 tokens


@pytest.mark.parametrize("wide_ms, words", [
    (5.0, "mostly noise"),  # the wide steps ran in half the time
    (11.0, "(memory-bound), as on a GPU"),  # 1.1x the time for 32x the tokens
    (40.0, "each token cost 8.0x less"),  # 4x the time for 32x the tokens
    (300.0, "here the step is compute-bound"),  # 30x the time for 32x the tokens
])
def test_quickstart_verdict_names_what_the_widest_quarter_cost(wide_ms, words):
    ms = [10.0, 10.0, 10.0, 10.0, 10.0, 10.0, wide_ms, wide_ms]
    verdict = step_time_verdict(TOKENS, ms)
    assert words in verdict
    assert verdict.startswith(f"The widest quarter of the steps (median 32 tokens) took {wide_ms / 10:.1f}x "
                              "the time of the smallest quarter (median 1 tokens): ")
    phrases = ("mostly noise", "(memory-bound), as on a GPU", "each token cost",
               "here the step is compute-bound")
    assert sum(p in verdict for p in phrases) == 1  # one reading, not two
    assert step_time_title(TOKENS, ms) == f"Here 32x the tokens in a step took {wide_ms / 10:.1f}x the time"


def test_quickstart_steps_of_one_size_get_a_count_and_no_verdict():
    assert step_time_title([8, 8, 8], [1.0, 2.0, 3.0]) == "3 steps, all of 8 tokens"
    assert step_time_verdict([8, 8, 8], [1.0, 2.0, 3.0]) is None


def test_quickstart_names_only_steps_far_slower_than_their_size():
    tokens, ms = [4, 4, 4, 4, 8, 8], [10.0, 10.0, 10.0, 95.0, 12.0, 12.0]
    note = slow_steps_note(tokens, ms)
    assert note.startswith("1 step(s) took over 3x the usual time for their size (up to 95 ms)")
    assert slow_steps_note(tokens, [10.0, 10.0, 10.0, 25.0, 12.0, 12.0]) is None  # 2.5x: not over 3x


def test_quickstart_plot_draws_one_dot_per_step_on_a_log2_axis():
    ax = plot_step_times([1, 2, 4], [3.0, 3.5, 5.0])
    assert ax.get_xscale() == "log" and len(ax.collections[0].get_offsets()) == 3
    assert "tokens" in ax.get_xlabel() and "(ms)" in ax.get_ylabel()


# ---- notebook 01: the knee, here and modelled ---------------------------------------------------

def test_flat_up_to_is_the_last_size_before_the_first_over_the_tolerance():
    assert flat_up_to([1, 2, 4, 8], [10.0, 11.0, 12.6, 11.0]) == 2  # 12.6 > 12.5; the dip after is not read
    assert flat_up_to([1, 2, 4, 8], [10.0, 10.0, 12.5, 12.5]) == 8  # at the tolerance is still flat
    assert flat_up_to([1, 2], [10.0, 30.0]) == 1
    assert flat_up_to([1, 2, 4], [10.0, 14.0, 14.0], tol=1.5) == 4


def test_measured_title_states_the_knee_only_when_the_rounds_settle_it():
    assert measured_title([1, 2, 4], [10.0, 11.0, 20.0], 2, 0.25) == \
        "This device: within 25% of 1 token up to 2 tokens; 2.0x the time for 4x the tokens"
    assert measured_title([1, 2, 4], [10.0, 11.0, 20.0], 2, 0.3) == \
        "This device: knee not settled (rounds spread 30%); 2.0x the time for 4x the tokens"


class BoundAt:
    """A stand-in cost model whose step turns compute-bound from ``tokens`` tokens on."""

    def __init__(self, tokens):
        self.tokens = tokens

    def forward_cost(self, num_tokens, *_):
        return SimpleNamespace(bound="compute" if num_tokens >= self.tokens else "memory")


def test_step_curve_verdict_on_a_quiet_run_that_bends():
    sizes, decode, chunk = [1, 2, 4, 8], [10.0, 10.5, 12.0, 20.0], [10.0, 11.0, 13.0, 30.0]
    text = step_curve_verdict(sizes, decode, chunk, 0.1, BoundAt(64), [1, 16, 64, 256], [1.0, 1.1, 1.3, 3.0])
    lines = text.split("\n")
    assert lines[0] == ("Measured here: a step of n decodes stays within 25% of a 1-token step up to n = 4; "
                        "8 decodes cost 2.0x one decode, and one 8-token chunk 3.0x a 1-token chunk.")
    assert lines[1].startswith("Past 4 tokens the step time here grows with the tokens")
    assert lines[2] == ("The modelled H100 stays within 25% up to 16 tokens, and turns compute-bound at "
                        "64 tokens.")
    assert len(lines) == 3  # no noise notes on a settled, monotone run


def test_step_curve_verdict_names_the_noise_it_sees():
    sizes, decode, chunk = [1, 2, 4], [10.0, 7.0, 11.0], [10.0, 10.0, 10.0]
    text = step_curve_verdict(sizes, decode, chunk, 0.6, BoundAt(10 ** 6), [1, 2], [1.0, 1.0])
    assert text.startswith("One size's rounds differed by 60% of its median")
    assert "2 decodes ran faster than 1: more work cannot take less time" in text
    # a knee the rounds do not settle is not read as "memory-bound over every size" either
    assert "This device stayed memory-bound" not in text
    assert "up to n = 4 in the medians (not settled)" in text
    assert "where this CPU turns compute-bound, is not settled on this run." in text
    assert "is memory-bound at every size plotted" in text
    assert "One size's timings differed by 60% between rounds" in text
    assert text.endswith("Steps of 2 tokens ran faster than a 1-token step, which an idle machine does "
                         "not do: other programs shared the CPU while the cell above ran, so its times are "
                         "partly noise; close them and run both cells again.")


def test_step_curve_verdict_reads_the_real_h100_model_as_the_notebook_does():
    cost = CostModel(load_hardware("h100"), load_model_spec("llama-3-8b"))
    grid = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    h100_ms = [cost.forward_time_s(n, n, n * 512, n * 512, n) * 1000 for n in grid]
    text = step_curve_verdict([1, 2], [10.0, 10.0], [10.0, 10.0], 0.0, cost, grid, h100_ms)
    assert f"The modelled H100 stays within 25% up to {flat_up_to(grid, h100_ms)} tokens, and " in text


def test_roofline_panels_draw_on_tiny_inputs():
    fig, (a, b) = plt.subplots(1, 2)
    plot_measured_steps(a, [1, 2], [3.0, 3.1], [3.0, 3.4])
    plot_modelled_steps(b, [1, 2, 4], [0.1, 0.1, 0.2])
    assert len(a.lines) == 2 and a.get_legend() is not None and a.get_xscale() == "log"
    assert len(b.lines) == 1 and b.get_yscale() == "log" and "512 tokens of context" in b.get_xlabel()


def test_steppers_time_steps_on_a_tiny_model():
    model = LlamaModel.random(tiny_config(vocab_size=4096), seed=0)
    decode = decode_stepper(model, None, 3, repeats=2, calls=2)
    chunk = chunk_stepper(model, None, 8, repeats=2)
    times = [decode(), decode(), chunk(), chunk()]  # two calls of each: every request still decoding
    assert all(t > 0 for t in times)


# ---- notebook 02: static against continuous, and the truck under load ---------------------------

def test_static_batches_hold_each_batch_until_its_longest_request_ends():
    engine = tiny_engine(max_num_seqs=2)
    log = engine.add_observer(StepLog())
    lengths = [3, 1, 2, 2, 4]
    prompts = [[5 + i, 6, 7, 8] for i in range(len(lengths))]
    params = [SamplingParams(max_tokens=m, temperature=0, ignore_eos=True) for m in lengths]
    wall_s = run_static_batches(engine, prompts, params, 2)
    assert wall_s > 0
    assert len(log.stats) == 3 + 2 + 4  # batches (3, 1), (2, 2), (4): each as long as its longest
    assert [r.num_output_tokens for r in engine.requests.values()] == lengths
    assert max(s.num_requests for s in log.stats) == 2


@pytest.mark.parametrize("static_wall_s, note", [
    (13.0, "It gained more in tokens per second than in steps"),  # 13x the speed for 2x fewer steps
    (1.5, "It gained less in tokens per second than in steps"),  # 1.5x for 2x
    (2.1, None),  # close to the steps' gain: nothing to explain
])
def test_static_vs_continuous_explains_only_a_gap_between_the_two_gains(static_wall_s, note):
    lines = static_vs_continuous_text(100, static_wall_s, 1.0, 20, 10, 8, 8).split("\n")
    assert lines[:2] == [f"static    : {100 / static_wall_s:6.1f} tok/s, 20 steps",
                         "continuous:  100.0 tok/s, 10 steps"]
    assert lines[2].startswith(f"Continuous batching took 10 steps against 20 (2.00x fewer) and ran "
                               f"{static_wall_s:.2f}x the tokens per second; 8 of 8 requests")
    assert len(lines) == (3 if note is None else 4)
    assert note is None or lines[3].startswith(note)


def test_static_vs_continuous_says_why_outputs_differ():
    text = static_vs_continuous_text(100, 2.0, 1.0, 20, 10, 7, 8)
    assert "7 of 8 requests produced the same tokens" in text and text.endswith("likeliest tokens.")


def test_round_median_takes_the_upper_middle_and_lines_show_the_range():
    assert round_median([3.0, 1.0, 2.0]) == 2.0 and round_median([1.0, 2.0, 3.0, 4.0]) == 3.0
    text = concurrency_lines([1, 4], {1: [10.0, 12.0, 11.0], 4: [30.0, 33.0, 31.0]},
                             {1: [50.0, 52.0, 51.0], 4: [90.0, 99.0, 95.0]}, 3)
    assert text.split("\n") == [
        "concurrency  1:   11.0 tok/s (10.0-12.0), p50 TPOT    51 ms (50-52) over 3 rounds",
        "concurrency  4:   31.0 tok/s (30.0-33.0), p50 TPOT    95 ms (90-99) over 3 rounds"]


def test_load_panels_are_titled_with_the_verdicts():
    tput = {1: [10.0, 11.0, 10.5], 4: [30.0, 33.0, 31.0]}
    tpot = {1: [50.0, 52.0, 51.0], 4: [100.0, 110.0, 104.0]}
    more, per_user = compare(tput[4], tput[1]), compare(tpot[4], tpot[1])
    fig, (a, b) = plt.subplots(1, 2)
    plot_load_rounds(a, b, [1, 4], tput, tpot, more, per_user)
    assert a.get_title().startswith("The truck at 4x the load: throughput higher: ")
    assert b.get_title().startswith("Each user's p50 TPOT 51 -> 104 ms: slower per user: ")
    assert len(a.containers) == 1 and len(b.containers) == 1  # one errorbar series per panel


@pytest.mark.parametrize("tpot_4, words", [
    ([100.0, 110.0, 104.0], "Each user's tokens came 2.0x slower: on this CPU a step of 4 decodes"),
    ([50.0, 52.0, 51.0], "Each user's tokens came about as fast as alone"),
    ([30.0, 31.0, 30.5], "Each user's tokens came faster under load in every round"),
    ([40.0, 60.0, 51.0], "too noisy to tell"),
])
def test_load_verdict_reads_the_per_user_finding(tpot_4, words):
    tpot_1 = [50.0, 52.0, 51.0]
    more = compare([30.0, 33.0, 31.0], [10.0, 11.0, 10.5])
    text = load_verdict([1, 4], more, compare(tpot_4, tpot_1), 3)
    assert text.startswith("Medians over 3 rounds, bars from the slowest to the fastest round. "
                           "From concurrency 1 to 4:")
    assert words in text
    assert "Throughput grew only a little" not in text  # about 3x: not a little


def test_load_verdict_names_a_small_throughput_gain():
    more = compare([11.0, 11.5, 11.2], [10.0, 10.0, 10.0])  # higher in every round, by about 12%
    text = load_verdict([1, 4], more, compare([100.0, 104.0, 102.0], [50.0, 52.0, 51.0]), 3)
    assert "Throughput grew only a little" in text
    assert "too noisy" not in text  # both findings clear: no note on noise


def test_a_profiled_step_names_its_largest_part_only_where_every_round_agrees():
    from course.exercises import PARTS
    from course.profile_lab import largest_part, split_line, split_verdict

    def split(mm, other, py):
        return dict(zip(PARTS, (mm, other, py)))
    steady = [split(0.015, 0.004, 0.003), split(0.014, 0.004, 0.004)]
    assert largest_part(steady) == "weight matmuls"
    assert largest_part([split(0.010, 0.002, 0.003), split(0.003, 0.002, 0.010)]) is None  # the rounds disagree
    assert split_line(steady).startswith("66% / 18% / 16% of a 22.0 ms step")
    many = [split(0.021, 0.008, 0.0035), split(0.021, 0.008, 0.0035)]
    line = split_verdict({1: steady, 16: many})
    assert "the matmuls took 1.4x their time" in line and "(1.0x, within the rounds' noise" in line
    grown = [split(0.021, 0.008, 0.009)] * 2
    assert "(2.6x;" in split_verdict({1: steady, 16: grown})  # beyond the noise: no such words


def test_capture_lines_read_both_profiles_and_name_the_machine(tmp_path):
    """Issue 58, item 4: notebook 01 prints the bench's eager and captured profiles of one step; the
    lines come from the files, with the saving and the machine they name (and the shipped pair reads)."""
    import json

    from course.profile_lab import capture_lines

    for suffix, step, python in (("", 0.0207, 0.0028), ("_compiled", 0.0163, 0.0010)):
        (tmp_path / f"decode_profile{suffix}.json").write_text(json.dumps(
            {"step_s": step, "uncovered_s": python, "cpu": "Some CPU (AVX2), 2 threads", "date": "2026-12-07"}))
    lines = capture_lines(tmp_path)
    assert lines[0].startswith("eager") and " 20.7 ms a step,  2.8 ms" in lines[0]
    assert lines[1].startswith("captured (--compile on)") and " 16.3 ms a step,  1.0 ms" in lines[1]
    assert lines[2] == "capture took 4.4 ms off the step (1.27x) on Some CPU (AVX2), 2 threads, 2026-12-07"
    assert len(capture_lines()) == 3  # the pair bench/results ships
