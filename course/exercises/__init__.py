"""Reference answers and check functions for the notebooks' exercises.

Each ``check_*`` function takes the learner's answer (``None`` = not attempted) and returns
"pass", "fail" or "not attempted" (see course.checks). Expected values are computed
from formulas here, never typed in, so the checks follow the inputs the notebook used.
The engine exercises (``check_02_admission_in_engine``, ``check_04_verify_in_engine``,
``check_04_policy_in_engine``) run the learner's code inside the real engine, through the seams
it offers (a Scheduler subclass, the Drafter protocol, a SpecPolicy), and judge it by what the
engine's own tests check: greedy speculation equals plain decoding token for token, every block
comes back, and the step records and request metrics show the rule at work.
"""

from __future__ import annotations

import functools
import math

import torch

from minispec.core.batch import EmittedTokens
from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from course.checks import check_function, check_number, run_check
from course.claims import neighbours
from course.json_lab import json_route, reference_draft_cut, use_draft_cut
from course.noise import compare, interleaved_rounds
from course.scenarios import policy_run
from minispec.core.support.metrics import request_metrics
from minispec.tools.summary import summarize
from minispec.extras.grammar import Allowed
from minispec.models.llama import LlamaModel, ModelConfig
from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model
from minispec.core.request import Request, SamplingParams
from minispec.core.scheduler import Scheduler
from minispec.sim import build_sim_engine, sweep
from minispec.sim.costmodel import CostModel, expected_accepted_length, leviathan_speedup
from minispec.sim.hardware import load_hardware
from minispec.sim.modelspec import load_model_spec
from minispec.core.drafters import NgramDrafter
from minispec.spec.policy import SpecPolicy
from minispec.base.structured_output import StructuredOutput
from minispec.tools.workload import load_prompts

# the trade-off exercises' device and models: the simulator's H100 with an 8B target and a 1B draft
H100 = {"hardware": "h100", "model": "llama-3-8b", "draft": "llama-3.2-1b"}


# -- 00 quickstart ------------------------------------------------------------------------------
def decode_roofline_tok_s(weight_bytes: float, bandwidth_bytes_s: float) -> float:
    """Upper bound on batch-1 decode steps per second: every step reads every weight once."""
    return bandwidth_bytes_s / weight_bytes


def check_00_roofline(answer, weight_bytes: float, bandwidth_bytes_s: float = 25e9, quiet=False) -> str:
    return check_number("00 decode roofline (tokens/s)", answer,
                        decode_roofline_tok_s(weight_bytes, bandwidth_bytes_s),
                        rel=0.05, hint="Divide bytes per second by bytes read per step.", quiet=quiet)


# -- 01 decode is memory-bound ------------------------------------------------------------------
def ridge_point_tokens(flops_per_s: float, bandwidth_bytes_s: float, bytes_per_weight: float) -> float:
    """Tokens per step where a step's weight FLOPs (2 per weight per token) take as long as reading
    the weights once: 2 * n / flops = bytes_per_weight / bandwidth (Williams et al. 2009, roofline)."""
    return flops_per_s * bytes_per_weight / (2 * bandwidth_bytes_s)


def check_01_ridge(answer, flops_per_s: float, bandwidth_bytes_s: float,
                   bytes_per_weight: float, quiet=False) -> str:
    return check_number("01 ridge point (tokens per step)", answer,
                        ridge_point_tokens(flops_per_s, bandwidth_bytes_s, bytes_per_weight), rel=0.05,
                        hint="Set compute time 2*P*n/FLOPs equal to memory time P*bytes/bandwidth and solve "
                             "for n.",
                        quiet=quiet)


# -- 02 continuous batching ---------------------------------------------------------------------
def static_batching_slot_steps(output_lengths: list[int], batch_size: int) -> int:
    """Decode slot-steps static batching spends: each batch runs until its longest request ends."""
    return sum(max(output_lengths[i: i + batch_size]) * len(output_lengths[i: i + batch_size])
               for i in range(0, len(output_lengths), batch_size))


def check_02_static_waste(fn, quiet=False) -> str:
    cases = [(([5, 5, 5, 5], 2), 20), (([1, 9, 3, 3], 2), 24), (([4, 1, 1, 1, 8], 2), 4 * 2 + 1 * 2 + 8),
             (([7], 4), 7), (([2, 3, 10], 3), 30)]
    return check_function("02 static batching slot-steps", fn, cases, quiet=quiet)


# -- 03 chunked prefill -------------------------------------------------------------------------
def prefill_steps(prompt_tokens: int, budget: int, num_decodes: int) -> int:
    """Steps a prompt needs when decodes go first and its chunks fill the rest of the budget."""
    return math.ceil(prompt_tokens / (budget - num_decodes))


def check_03_prefill_steps(fn, quiet=False) -> str:
    cases = [((2000, 256, 8), 9), ((100, 64, 0), 2), ((64, 64, 0), 1), ((1000, 512, 12), 2), ((17, 10, 2), 3)]
    return check_function("03 steps to prefill a long prompt", fn, cases, quiet=quiet)


DIRECTIONS = ("lower", "higher")


def retime_03_budget(run, my_budget, predict_itl, predict_ttft, baseline: int = 256, rounds: int = 2,
                     quiet=False) -> str:
    """Notebook 03's live exercise: the engine re-timed with the learner's token budget.

    Args:
        run: ``run(budget)`` -> the notebook's arrival-run results (a dict with ``itl_p99_s``, the
            decoders' p99 inter-token latency, and ``newcomer_ttft_s``, both seconds).
        my_budget: the learner's ``max_num_batched_tokens`` (an int >= 16, not ``baseline``).
        predict_itl, predict_ttft: "lower" or "higher": how the learner expects the decoders' p99
            ITL and the newcomer's TTFT to move against ``baseline``.
        rounds: interleaved rounds of both budgets (>= 2, so that a verdict can be told from noise).
    Passes when every direction the rounds settle (``compare``: all rounds agree) is the predicted
    one; a direction the rounds leave unsettled is reported, not counted against the learner.
    """
    def test():
        for name, value in (("predict_itl", predict_itl), ("predict_ttft", predict_ttft)):
            if value not in DIRECTIONS:
                return False, f"{name}={value!r}: write 'lower' or 'higher'"
        if (not isinstance(my_budget, int) or isinstance(my_budget, bool) or my_budget < 16
            or my_budget == baseline):
            return False, (f"my_budget={my_budget!r}: choose a whole number of tokens >= 16 other than "
                           f"{baseline}")
        kept = {"yours": [], "baseline": []}

        def arm(name, budget):
            def one() -> float:
                kept[name].append(run(budget))
                return kept[name][-1]["itl_p99_s"]
            return one
        interleaved_rounds({"yours": arm("yours", my_budget), "baseline": arm("baseline", baseline)},
                           rounds=rounds)
        lines, wrong = [], []
        for key, label, guess in (("itl_p99_s", "decoders' p99 ITL", predict_itl),
                                  ("newcomer_ttft_s", "newcomer's TTFT", predict_ttft)):
            v = compare([r[key] for r in kept["yours"]], [r[key] for r in kept["baseline"]])
            lines.append(f"{label} {v.text('higher', 'lower')}")
            if v.finding in DIRECTIONS and v.finding != guess:  # every round agreed, beyond the dead zone
                wrong.append(f"the {label} came out {v.finding}, you predicted {guess}")
        text = f"budget {my_budget} against {baseline}, {rounds} interleaved rounds: " + "; ".join(lines)
        if wrong:
            return False, (text + ". " + "; ".join(wrong)
                           + ": which way does a bigger budget move a step's size?")
        return True, text + ". Every direction the rounds settled is the one you predicted."
    attempted = my_budget is not None or predict_itl is not None or predict_ttft is not None
    return run_check("03 re-time the engine with your token budget", test, attempted=attempted, quiet=quiet)


# -- 04 speculative decoding --------------------------------------------------------------------
def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Mean tokens emitted per verify step, bonus included (Leviathan et al. 2023, eq. 1)."""
    return expected_accepted_length(alpha, k)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Walltime improvement at batch 1 with a draft step costing c target steps (Leviathan et al.
    2023, Theorem 3.8)."""
    return leviathan_speedup(alpha, k, c)


def check_04_expected_tokens(fn, quiet=False) -> str:
    cases = [((a, k), expected_tokens_per_step(a, k)) for a in (0.0, 0.3, 0.6, 0.8, 0.95) for k in (1, 4, 7)]
    cases.append(((1.0, 4), 5.0))
    return check_function("04 expected tokens per verify step", fn, cases, rel=1e-6, quiet=quiet)


def reference_greedy_verify(draft: list[int], target_argmax: list[int]) -> list[int]:
    """Accepted drafts then the target's token at the first mismatch (or the bonus token)."""
    out = []
    for d, t in zip(draft, target_argmax):
        if d != t:
            return out + [t]
        out.append(d)
    return out + [target_argmax[len(draft)]]


def check_04_greedy_verify(fn, quiet=False) -> str:
    cases = [(([5, 6, 7], [5, 6, 7, 8]), [5, 6, 7, 8]), (([5, 6, 7], [5, 9, 7, 8]), [5, 9]),
             (([1], [2, 3]), [2]), (([], [4]), [4]), (([3, 3], [3, 3, 3]), [3, 3, 3])]

    def test():
        for args, expected in cases:
            got = list(fn(*[list(a) for a in args]))
            if got != expected:
                return False, f"greedy_verify{args} returned {got}, expected {expected}"
        return True, f"all {len(cases)} cases agree"
    return run_check("04 greedy verification", test, attempted=fn is not None, quiet=quiet)


# -- 05 messenger against truck, 06 what speculation costs ---------------------------------------
def reference_first_losing_concurrency(rows: list[dict], method: str):
    """Smallest concurrency whose speedup for ``method`` is below 1.0, else None."""
    losing = sorted(r["concurrency"] for r in rows if r["spec"] == method and r["speedup_vs_off"] < 1.0)
    return losing[0] if losing else None


def check_05_crossover(fn, quiet=False) -> str:
    def rows(speedups):
        return [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in speedups] + \
               [{"spec": "off", "concurrency": c, "speedup_vs_off": 1.0} for c, _ in speedups]
    inputs = [rows([(1, 1.6), (8, 1.2), (32, 0.95), (64, 0.8)]),
              rows([(64, 0.7), (1, 1.5), (16, 1.1), (32, 0.99)]),
              rows([(1, 1.4), (8, 1.05)]), rows([(1, 0.9), (4, 1.1)])]
    cases = [((r, "draft"), reference_first_losing_concurrency(r, "draft")) for r in inputs]
    return check_function("05 first concurrency where speculation loses", fn, cases, quiet=quiet)


def h100_cost() -> CostModel:
    """The cost model of the trade-off exercises: H100, 8B target, 1B draft, bfloat16."""
    target = load_model_spec(H100["model"], "bfloat16", "bfloat16")
    draft = load_model_spec(H100["draft"], "bfloat16", "bfloat16")
    return CostModel(load_hardware(H100["hardware"]), target, draft)


USER_FLEET_GRID = {"concurrency": (1, 2, 4, 8, 16, 32, 64, 128), "k": (0, 2, 4)}


@functools.lru_cache(maxsize=4)
def user_fleet_table(alpha: float = 0.8, num_requests: int = 256) -> dict:
    """Simulated H100 runs over USER_FLEET_GRID: {(concurrency, k): {"user_tok_s": 1 / median TPOT,
    "fleet_tok_s": output tokens/s of the whole run}}; k 0 is spec off. Takes a few seconds."""
    table = {}
    for k in USER_FLEET_GRID["k"]:  # spec off once (k 0), then each k's speculating runs
        for row in sweep(**H100, alpha=alpha, k=max(k, 1), concurrency=USER_FLEET_GRID["concurrency"],
                         num_requests=num_requests, max_tokens=64, methods="draft" if k else "off"):
            table[(row["concurrency"], k)] = {"user_tok_s": 1.0 / row["tpot_p50_s"],
                                              "fleet_tok_s": row["throughput_tok_s"]}
    return table


def best_fleet_under_promise(table: dict, user_tok_s: float) -> tuple[int, int] | None:
    """The (concurrency, k) with the most fleet tokens/s among those whose median user gets at
    least ``user_tok_s``; None if none does."""
    ok = [key for key, row in table.items() if row["user_tok_s"] >= user_tok_s]
    return max(ok, key=lambda key: table[key]["fleet_tok_s"]) if ok else None


def check_05_user_fleet(choice, user_tok_s: float, alpha: float = 0.8, quiet=False) -> str:
    """``choice`` = (concurrency, k): pass when the simulated median user gets ``user_tok_s`` and
    the fleet's tokens/s is within 5% of the best choice that keeps the promise."""
    def test():
        table = user_fleet_table(alpha)
        if tuple(choice) not in table:
            return False, (f"{choice!r} is not on the grid: concurrency in {USER_FLEET_GRID['concurrency']}, "
                           f"k in {USER_FLEET_GRID['k']}")
        row, best = table[tuple(choice)], best_fleet_under_promise(table, user_tok_s)
        c, k = choice
        said = f"c={c}, k={k}: each user {row['user_tok_s']:.0f} tok/s, fleet {row['fleet_tok_s']:.0f} tok/s"
        if row["user_tok_s"] < user_tok_s:
            return False, f"{said}: below the promise of {user_tok_s:.0f} tok/s per user"
        ok = row["fleet_tok_s"] >= 0.95 * table[best]["fleet_tok_s"]
        return ok, said + ("" if ok else f"; c={best[0]}, k={best[1]} keeps the promise with "
                                          f"{table[best]['fleet_tok_s']:.0f} tok/s")
    return run_check(f"05 most fleet throughput at {user_tok_s:.0f} tok/s per user", test,
                     attempted=choice is not None, quiet=quiet)


def simulated_neighbour_slowdown(batch: int, num_speculating: int, k: int, alpha: float = 0.8) -> float:
    """Median TPOT of a plain request whose ``num_speculating`` neighbours (of ``batch``) verify k
    drafts every step, over its TPOT beside plain neighbours, on the simulated H100 (prompts of 512
    tokens, 64 output tokens; the speculating requests outlast the plain ones)."""
    config = EngineConfig(model=H100["model"], spec=SpecConfig(method="draft", num_speculative_tokens=k,
                                                               draft_model=H100["draft"], alpha=alpha))
    out = neighbours(lambda c: build_sim_engine(c, hardware=H100["hardware"]), config, [[1] * 512],
                     num_speculating, batch - num_speculating, max_tokens=64, interactive_max_tokens=400)
    return out["speculating"]["bulk"]["tpot_p50_s"] / out["plain"]["bulk"]["tpot_p50_s"]


def check_06_neighbour_slowdown(fn, quiet=False) -> str:
    """``fn(cost, batch, num_speculating, k, context)`` predicts how much slower a plain request's
    TPOT gets beside speculating neighbours; pass when it is within 10% of the simulator's."""
    cost = h100_cost()
    cases = [(32, 8, 4), (16, 4, 2), (8, 1, 4)]

    def test():
        lines = []
        for batch, n, k in cases:
            predicted, simulated = fn(cost, batch, n, k, 544), simulated_neighbour_slowdown(batch, n, k)
            lines.append(f"batch {batch}, {n} speculating with k {k}: predicted {predicted:.2f}x, simulated "
                         f"{simulated:.2f}x")
            if abs(predicted / simulated - 1) > 0.10:
                return False, "; ".join(lines) + " (more than 10% apart)"
        return True, "; ".join(lines)
    return run_check("06 a plain request beside speculating neighbours", test,
                     attempted=fn is not None, quiet=quiet)


def reference_tree_cost(step_time, concurrency: int, num_nodes: int) -> float:
    """A verify step's target forward over a plain decode step's, from a step-time curve: at
    concurrency c every request packs its last token and its tree's ``num_nodes`` nodes, so the
    step carries c (num_nodes + 1) rows where a decode step carries c (the draft's forwards aside)."""
    return step_time(concurrency * (num_nodes + 1)) / step_time(concurrency)


def _interpolated(points: dict[int, float]):
    """A step-time curve through measured (tokens, seconds) points, linear between them."""
    xs = sorted(points)

    def step_time(n: float) -> float:
        if n <= xs[0]:
            return points[xs[0]]
        for a, b in zip(xs, xs[1:]):
            if n <= b:
                return points[a] + (points[b] - points[a]) * (n - a) / (b - a)
        a, b = xs[-2], xs[-1]
        return points[b] + (points[b] - points[a]) * (n - b) / (b - a)
    return step_time


TREE_COST_CURVES = {  # a laptop-like curve (knee after a few tokens) and a roofline with a late knee
    "a 2-core CPU": _interpolated({1: 0.022, 2: 0.023, 4: 0.026, 8: 0.035, 16: 0.055, 32: 0.09, 64: 0.17,
                                   128: 0.33}),
    "a roofline, knee at 64 tokens": lambda n: max(0.010, 0.010 * n / 64) + 0.0005,
}


def check_06_tree_cost(fn, quiet=False) -> str:
    """``fn(step_time, concurrency, num_nodes)`` predicts a tree verify's target forward in decode
    steps from a step-time curve ``step_time(num_tokens) -> seconds``; pass within 3% of the
    reference on two curves and four (concurrency, nodes) cases."""
    cases = [(1, 8), (4, 8), (8, 4), (32, 8)]

    def test():
        lines = []
        for curve_name, curve in TREE_COST_CURVES.items():
            for c, n in cases:
                got, want = fn(curve, c, n), reference_tree_cost(curve, c, n)
                if abs(got / want - 1) > 0.03:
                    return False, (f"on {curve_name}, concurrency {c}, {n} nodes: predicted {got:.2f} decode "
                                   f"steps, the curve says {want:.2f} (count every row "
                                   "the verify step packs)")
                lines.append(f"{want:.2f}")
        return True, f"all {len(lines)} cases within 3% ({', '.join(lines)} decode steps)"
    return run_check("06 a draft tree's verify cost from the step-time curve", test, attempted=fn is not None,
                     quiet=quiet)


# -- 07 policies ---------------------------------------------------------------------------------
def reference_threshold(rows: list[dict], method: str) -> int:
    """Largest concurrency below the first losing one (the N for a threshold:N policy)."""
    first = reference_first_losing_concurrency(rows, method)
    ok = [r["concurrency"] for r in rows if r["spec"] == method
          and (first is None or r["concurrency"] < first)]
    return max(ok) if ok else 0


def check_07_threshold(fn, quiet=False) -> str:
    def rows(speedups):
        return [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in speedups]
    inputs = [rows([(1, 1.6), (8, 1.2), (32, 0.95), (64, 0.8)]),
              rows([(1, 1.6), (8, 1.2), (16, 1.01), (32, 1.2), (64, 0.8)]),
              rows([(1, 0.9), (4, 0.8)]), rows([(1, 1.3), (128, 1.1)]),
              rows([(1, 1.5), (8, 0.9), (32, 1.05), (64, 0.8)])]  # the last: a win after a loss
    cases = [((r, "draft"), reference_threshold(r, "draft")) for r in inputs]
    return check_function("07 threshold from a speedup curve", fn, cases, quiet=quiet)


@functools.lru_cache(maxsize=64)
def simulated_tok_s(alpha: float, k: int, concurrency: int = 8, num_requests: int = 128) -> float:
    """Output tokens/s with k drafts (0 = spec off, which does not depend on alpha) at
    ``concurrency`` on the simulated H100 (1B draft). Deterministic for fixed arguments."""
    if k == 0:
        alpha = 0.0  # one spec-off run serves every alpha
    rows = sweep(**H100, alpha=alpha, k=max(k, 1), concurrency=[concurrency], num_requests=num_requests,
                 max_tokens=64, methods="draft" if k else "off")
    return rows[0]["throughput_tok_s"]


def simulated_speedup(alpha: float, k: int, concurrency: int = 8, num_requests: int = 128) -> float:
    """Throughput with k drafts over spec off at ``concurrency`` on the simulated H100 (1B draft)."""
    return (simulated_tok_s(alpha, k, concurrency, num_requests)
            / simulated_tok_s(alpha, 0, concurrency, num_requests))


def check_07_json_route(json_k, break_even_alpha,
                        alpha: float = 0.3, concurrency: int = 8, quiet=False) -> str:
    """The JSON route (acceptance ``alpha``) at ``concurrency``: ``json_k`` (0..6) must be within 5%
    of the best k's throughput, and ``break_even_alpha`` within 0.07 of the alpha where k = 2 starts
    to pay, both on the simulator."""
    def test():
        speed = {k: simulated_speedup(alpha, k, concurrency) for k in range(7)}
        best = max(speed, key=speed.get)
        if json_k not in speed:
            return False, f"json_k={json_k!r}: choose an int in 0..6"
        if speed[json_k] < 0.95 * speed[best]:
            return False, f"k={json_k} gives {speed[json_k]:.2f}x spec off; k={best} gives {speed[best]:.2f}x"
        lo = simulated_speedup(round(break_even_alpha - 0.07, 3), 2, concurrency)
        hi = simulated_speedup(round(break_even_alpha + 0.07, 3), 2, concurrency)
        ok = lo < 1.0 < hi
        return ok, (f"k={json_k}: {speed[json_k]:.2f}x spec off (best k={best}, {speed[best]:.2f}x); k=2 "
                    f"gives {lo:.2f}x at alpha {break_even_alpha - 0.07:.2f} and {hi:.2f}x at "
                    f"{break_even_alpha + 0.07:.2f}"
                    + ("" if ok else ": the break-even alpha is not between them"))
    return run_check("07 the JSON route's k and break-even alpha", test,
                     attempted=json_k is not None and break_even_alpha is not None, quiet=quiet)


def check_07_thrash(policy_class, threshold: int = 16, k: int = 4, quiet=False) -> str:
    """The failure-modes lab's exercise: ``policy_class(k, threshold)`` is a SpecPolicy that must
    (1) speculate while few requests are held and not while many are, and stay off through a dip
    of one step (a cohort finishing), yet come back on once the load stayed low for 32 steps; and
    (2) on the lab's simulated H100 workload (``scenarios.LAB``), keep p90 TPOT within 3% of spec
    off's and throughput within 0.5% of it at 24 and 32 requests, and at least 95% of always'
    throughput at 8 (the targets of issue 34)."""
    def test():
        policy = policy_class(k, threshold)

        def ks(loads):
            return [int(policy.choose_k([object()] * n, n)) for n in loads]
        low = ks([4] * 8)
        if not all(low):
            return False, (f"with 4 requests held the policy gave k={low}: it should "
                           "speculate while few are held")
        busy = ks([4 * threshold] * 8)
        if any(busy):
            return False, (f"with {4 * threshold} requests held it gave k={busy[-1]}: it "
                           "should not speculate then")
        dip = ks([threshold // 2] + [4 * threshold] * 3)
        if any(dip):
            return False, (f"a load that dipped to {threshold // 2} for one step (a cohort finishing, the "
                           f"next requests not yet admitted) switched speculation on (k={dip}): look back "
                           "over more than one step")
        back = ks([threshold // 2] * 32)
        if not back[-1]:
            return False, (f"after 32 steps at {threshold // 2} requests it still gave k=0: "
                           "it never comes back on")
        for c in (24, 32):
            mine, _ = policy_run(policy_class(k, threshold), c)
            never, _ = policy_run("never", c)
            if (mine["tpot_p90_s"] > 1.03 * never["tpot_p90_s"]
                or mine["throughput_tok_s"] < 0.995 * never["throughput_tok_s"]):
                return False, (f"at {c} requests: p90 TPOT {1000 * mine['tpot_p90_s']:.2f} ms against spec "
                               f"off's {1000 * never['tpot_p90_s']:.2f}, throughput "
                               f"{mine['throughput_tok_s']:.0f} against {never['throughput_tok_s']:.0f} "
                               "tok/s: which count does it read?")
        mine, _ = policy_run(policy_class(k, threshold), 8)
        always, _ = policy_run("always", 8)
        if mine["throughput_tok_s"] < 0.95 * always["throughput_tok_s"]:
            return False, ("at 8 requests it kept "
                           f"{mine['throughput_tok_s'] / always['throughput_tok_s']:.0%} of always' "
                           "throughput (goal 95%)")
        return True, (f"no dip switches it on; at 24 and 32 requests it matches spec off, at 8 it keeps "
                      f"{mine['throughput_tok_s'] / always['throughput_tok_s']:.0%} of always' throughput")
    return run_check("07 a threshold that does not thrash", test,
                     attempted=policy_class is not None, quiet=quiet)


def check_07_draft_cut(cut, tokenizer=None, quiet=False) -> str:
    """The JSON lab's exercise: ``cut(drafts, allowed) -> int``, how many drafts to keep before the
    verify (``json_lab.reference_draft_cut``'s contract). Pass when (1) it agrees with the engine's
    rule on small grammars (a draft rejected first, in the middle, past the grammar's end, an id
    outside the vocabulary, no drafts) and (2) inside the engine (a tiny random model over the
    bundled tokenizer, n-gram k 4, the route's JSON schemas, jump-forward off so every draft is
    the drafter's) greedy outputs equal those of the engine's own cut and it keeps the same drafts."""
    def test():
        for drafts, want, why in _TOY_CUTS:
            got = cut(list(drafts), _toy_allowed)
            if got != want:
                return False, f"drafts {list(drafts)} ({why}): returned {got!r}, expected {want}"
        mine, ref = (_cut_run(tokenizer, fn) for fn in (cut, reference_draft_cut))
        if mine["failed"]:
            return False, f"inside the engine a request failed: {mine['failed'][0]}"
        diff = _first_difference(mine["outputs"], ref["outputs"])
        if diff:
            return False, f"inside the engine {diff.replace('plain decoding', 'the engine cut')}"
        if mine["kept"] != ref["kept"]:
            return False, (f"inside the engine it kept {mine['kept']} drafts where the engine's cut keeps "
                           f"{ref['kept']}: "
                           "outputs equal, but every draft cut that the grammar allows is a token the verify "
                           "could have kept")
        return True, (f"{len(_TOY_CUTS)} small cases agree; in the engine the outputs equal "
                      "its own cut's, and of "
                      f"{ref['proposed']} n-gram drafts you kept the same {ref['kept']} for the verify")
    return run_check("07 cut a draft at the grammar", test, attempted=cut is not None, quiet=quiet)


def _toy_allowed(path):
    """A small grammar over ids 0..7: {1, 2}, then {3}, then {4, 5}, then only EOS (id 0, ended)."""
    steps = [{1, 2}, {3}, {4, 5}]
    for i, token in enumerate(path):
        if i >= len(steps) or token not in steps[i]:
            raise ValueError(f"allowed({list(path)}): draft {token} at {i} breaks the grammar; ask only "
                             "about paths it allowed in turn")
    ids = steps[len(path)] if len(path) < len(steps) else {0}
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(ids)] = True
    return Allowed(mask, len(ids), ended=len(path) >= len(steps), complete=len(path) >= len(steps))


_TOY_CUTS = [((1, 3, 4), 3, "all allowed"), ((2, 5, 4), 1, "the second rejected"),
             ((7, 3), 0, "the first rejected"),
             ((1, 3, 5, 0), 3, "past the grammar's end: nothing is drafted there, not even EOS"),
             ((1, 99), 1, "99 is no id of the vocabulary (8 ids)"), ((), 0, "no drafts")]


def _cut_run(tokenizer, cut) -> dict:
    """Greedy constrained n-gram speculation (jump-forward off) of four JSON prompts on a tiny
    random model over the bundled tokenizer, the engine cutting drafts with ``cut``."""
    if tokenizer is None:
        tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
    config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=256, block_size=4, max_model_len=512,
                          kernels="reference", weights="float32", scheduler=SchedulerConfig(max_num_seqs=4),
                          spec=SpecConfig(method="ngram", num_speculative_tokens=4, jump_forward=False))
    engine = build_engine(config, model=LlamaModel.random(ModelConfig.tiny(len(tokenizer)), seed=0),
                          tokenizer=tokenizer)
    use_draft_cut(engine, cut)
    proposed = [0]
    drafter = engine.executor.drafter

    def propose(observe=drafter.propose):  # count what the drafter proposed, before the cut
        def wrapped(speculating):
            out = observe(speculating)
            proposed[0] += sum(len(s.draft_token_ids) for s in speculating)
            return out
        return wrapped
    drafter.propose = propose()
    ids = [engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0.0,
                                                     structured=StructuredOutput("json_schema", schema)))
           for prompt, schema in json_route(4)]
    outs = {o.request_id: o for o in engine.run_until_done()}
    reqs = [engine.requests[i] for i in ids]
    return {"outputs": [r.output_token_ids for r in reqs], "kept": sum(r.num_draft_proposed for r in reqs),
            "proposed": proposed[0],
            "failed": [f"{outs[i].finish_reason}: {outs[i].error}" for i in ids
                       if getattr(outs[i], "error", None)]}


# -- 08 capstone ---------------------------------------------------------------------------------
def check_08_policy(result: dict | None, quiet=False) -> str:
    """``result`` is grade_policy's report: pass when, at every load, the bulk lane keeps its
    throughput goal and the interactive lane's SLO attainment reaches its target."""
    def test():
        sc = result["scores"]
        parts = [f"c={load}: bulk {s['bulk_share']:.2f} of never's throughput (goal "
                 f"{result['bulk_goal']:.2f}), interactive SLO attainment {s['attainment']:.2f} (target "
                 f"{s['attainment_target']:.2f})"
                 + ("" if s["passed"] else " <- missed") for load, s in sc.items()]
        return result["passed"], "; ".join(parts)
    return run_check("08 capstone policy", test, attempted=result is not None, quiet=quiet)


# -- 09 packed-device lab ------------------------------------------------------------------------
def prefill_tokens_saved(prompt_tokens: list[int], shared_prefix_tokens: int, block_size: int) -> int:
    """Prompt tokens a warm prefix cache spares prefill, summed over requests.

    Every request starts with the same ``shared_prefix_tokens`` tokens, already cached (a server
    that has served this traffic). Only full blocks are cached, and the last prompt token is always
    computed (its logits give the first output token), so request i skips
    ``block_size * min(shared_prefix_tokens // block_size, (prompt_tokens[i] - 1) // block_size)``.
    """
    full_blocks = shared_prefix_tokens // block_size
    return sum(block_size * min(full_blocks, (p - 1) // block_size) for p in prompt_tokens)


def check_09_prefix_saving(fn, quiet=False) -> str:
    cases = [(([600, 620, 640], 560, 16), 3 * 560),       # a prefix of whole blocks, longer prompts
             (([600, 600], 570, 16), 2 * 560),            # a part block is computed again
             # a prompt that is all prefix: its last block is computed
             (([64, 64], 64, 16), 2 * 48),
             (([100], 10, 16), 0),                         # a prefix shorter than a block saves nothing
             (([33, 300, 17], 200, 16), 32 + 192 + 16),   # short prompts cap what they can hit
             (([550] * 8, 550, 32), 8 * 544)]
    return check_function("09 prefill tokens a warm prefix cache saves", fn, cases, quiet=quiet)


# -- the engine exercises: the learner's code inside the real engine ---------------------------------
def tiny_course_model(seed: int = 0) -> LlamaModel:
    """A tiny random-weight Llama (vocabulary 256): the engine exercises' default model, so a check
    runs in seconds; greedy decoding of random weights loops, so n-gram lookup finds drafts."""
    return LlamaModel.random(ModelConfig.tiny(), seed=seed)


def _engine(model, tokenizer=None, spec: SpecConfig | None = None, policy=None, max_num_seqs: int = 8):
    """An engine on ``model`` (the bundled one, or ``tiny_course_model()``); a tiny model gets a
    small pool and the plain ``x @ W`` kernels the equivalence tests use."""
    if tokenizer is None:
        config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=256, block_size=4, max_model_len=256,
                              kernels="reference", scheduler=SchedulerConfig(max_num_seqs=max_num_seqs),
                              spec=spec or SpecConfig())
    else:
        config = EngineConfig(scheduler=SchedulerConfig(max_num_seqs=max_num_seqs), spec=spec or SpecConfig())
    return build_engine(config, model=model, tokenizer=tokenizer, policy=policy)


def _course_prompts(tokenizer, kind: str, n: int) -> list:
    """``n`` prompts for a check: the course's prompts of ``kind`` with a tokenizer, else token
    ids that repeat (so n-gram lookup finds drafts) of lengths that differ."""
    if tokenizer is not None:
        return load_prompts(kind)[:n]
    return [[(7 * i + j) % 50 + 1 for j in range(4 + 3 * i)] * 2 for i in range(n)][::-1]


def _generate(engine, prompts, max_tokens, plain: bool = False) -> list[list[int]]:
    """Greedy outputs of ``prompts`` (added at once; ``max_tokens`` an int or one per prompt) on
    ``engine``, in order; ``plain``: the requests opt out of speculation (``num_speculative_tokens``
    0), so one engine gives both runs. Every block must come back; the prefix cache is then
    emptied, so the next run computes what this one did (no hit changes its arithmetic)."""
    lengths = max_tokens if isinstance(max_tokens, (list, tuple)) else [max_tokens] * len(prompts)
    ids = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                                num_speculative_tokens=0 if plain else None))
           for p, n in zip(prompts, lengths)]
    engine.run_until_done()
    engine.block_manager.check_invariants()
    if engine.num_free_blocks != engine.block_manager.num_blocks:
        raise AssertionError("KV blocks were not all returned at the end of the run")
    engine.reset_prefix_cache()
    return [engine.requests[i].output_token_ids for i in ids]


def _first_difference(got: list[list[int]], want: list[list[int]]) -> str | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            j = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f"request {i}: output token {j} differs ({a[j:j + 1]} against plain decoding's "
                    f"{b[j:j + 1]})")
    return None


# 02: an admission rule inside the scheduler
class AdmissionRuleScheduler(Scheduler):
    """The engine's Scheduler with its admission rule (``next_waiting``) replaced by ``rule``:
    ``rule(waiting)`` gets the waiting requests (a list of Request, most urgent lane first, then
    arrival) and returns the one to admit next."""

    def __init__(self, base: Scheduler, rule):
        super().__init__(base.config, base.block_manager, base.max_model_len, base.policy)
        self.rule = rule

    def next_waiting(self) -> Request | None:
        waiting = [r for queue in self.waiting.values() for r in queue]
        return self.rule(waiting) if waiting else None


def reference_shortest_prompt_first(waiting: list[Request]) -> Request:
    """The waiting request with the fewest prompt tokens (ties: the one that arrived first)."""
    return min(waiting, key=lambda r: (r.num_prompt_tokens, r.arrival_order))


def run_admission(engine, rule, tokenizer=None, n: int = 6, max_tokens: int = 8) -> dict:
    """``n`` prompts of different lengths added at once (the longest first) to ``engine``, its
    scheduler admitting by ``rule`` (None: the engine's own, first come first served). Returns
    {"order": prompt lengths in admission order, "outputs": token ids per request}."""
    if rule is not None:
        engine.scheduler = AdmissionRuleScheduler(engine.scheduler, rule)
    prompts = sorted((engine.tokenize(p) for p in _course_prompts(tokenizer, "chat", n)),
                     key=len, reverse=True)
    before = set(engine.requests)
    outputs = _generate(engine, prompts, max_tokens)
    reqs = sorted((r for rid, r in engine.requests.items() if rid not in before),
                  key=lambda r: r.first_scheduled_time_s)
    return {"order": [r.num_prompt_tokens for r in reqs], "outputs": outputs}


def simulated_admission_ttft(rule, lengths=(4096, 2048, 1024, 512, 256, 128), max_num_seqs: int = 2) -> float:
    """Mean TTFT (s) of prompts of ``lengths`` tokens, added at once in that order, admitted by
    ``rule`` (None: first come first served) on the simulated H100 serving an 8B model: the same
    Scheduler on a virtual clock, where a prompt's prefill costs what its length costs."""
    config = EngineConfig(model=H100["model"], enable_prefix_caching=False,
                          scheduler=SchedulerConfig(max_num_seqs=max_num_seqs))
    engine = build_sim_engine(config, hardware=H100["hardware"])
    if rule is not None:
        engine.scheduler = AdmissionRuleScheduler(engine.scheduler, rule)
    for n in lengths:
        engine.add_request([1] * n, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    engine.run_until_done()
    ttft = [request_metrics(r)["ttft_s"] for r in engine.requests.values()]
    return sum(ttft) / len(ttft)


def check_02_admission_in_engine(rule, model=None, tokenizer=None, quiet=False) -> str:
    """``rule(waiting) -> Request`` runs as the scheduler's admission rule: pass when the real
    engine admits the shortest prompt first, every request gets its tokens and every block comes
    back; the simulated H100 then shows what it does to the mean TTFT."""
    def test():
        engine = _engine(model or tiny_course_model(), tokenizer, max_num_seqs=2)
        fcfs = run_admission(engine, None, tokenizer)
        mine = run_admission(engine, rule, tokenizer)
        want = sorted(mine["order"])
        if mine["order"] != want:
            return False, (f"the engine admitted prompts of {mine['order']} tokens in that order; shortest "
                           f"first is {want}")
        if any(len(o) != len(f) for o, f in zip(mine["outputs"], fcfs["outputs"])):
            return False, "a request did not get all its tokens"
        sim, sim_fcfs = simulated_admission_ttft(rule), simulated_admission_ttft(None)
        return True, (f"admitted {want} (first come first served: {fcfs['order']}), every "
                      "block came back; on the "
                      f"simulated H100 (8B model) mean TTFT {sim * 1e3:.0f} ms against "
                      f"{sim_fcfs * 1e3:.0f} ms")
    return run_check("02 your admission rule inside the scheduler", test,
                     attempted=rule is not None, quiet=quiet)


# 04: a greedy verify inside the engine, through the Drafter protocol
class LearnerVerifyDrafter(NgramDrafter):
    """The engine's n-gram drafter with its verify replaced by the learner's
    ``greedy_verify(draft, target_argmax)`` (a greedy request's drafts against the target's argmax
    at each of the k + 1 positions). Counts the verifies it answered."""

    def __init__(self, greedy_verify):
        super().__init__(1, 4)
        self.greedy_verify = greedy_verify
        self.num_verifies = 0
        self.disagreements: list[str] = []  # where the learner's answer differs from the engine's verify

    def verify(self, scheduled, target_logits):
        self.num_verifies += 1
        drafts = list(scheduled.draft_token_ids)
        emitted = [int(t) for t in self.greedy_verify(drafts, target_logits.argmax(dim=-1).tolist())]
        engines = super().verify(scheduled, target_logits).token_ids
        if emitted != engines:
            self.disagreements.append(f"drafts {drafts}: yours emitted {emitted}, the engine's verify "
                                      f"{engines}")
        return EmittedTokens(emitted, len(drafts), len(emitted) - 1)


def check_04_verify_in_engine(greedy_verify, model=None, tokenizer=None,
                              max_tokens: int = 24, quiet=False) -> str:
    """``greedy_verify`` replaces the engine's verify (no fault guard around it): pass when n-gram
    speculation with it gives plain decoding's output token for token and it verified drafts."""
    def test():
        # called once outside the engine first: an unwritten exercise (NotImplementedError) is "not
        # attempted" here, where inside the engine its guard would fail the requests with a traceback
        greedy_verify([5, 6], [5, 7, 8])
        prompts = _course_prompts(tokenizer, "copy", 2)
        engine = _engine(model or tiny_course_model(), tokenizer,
                         SpecConfig(method="ngram", num_speculative_tokens=4))
        drafter = LearnerVerifyDrafter(greedy_verify)
        engine.executor.drafter = drafter  # in place of the guarded one: a wrong verify shows
        plain = _generate(engine, prompts, max_tokens, plain=True)
        outputs = _generate(engine, prompts, max_tokens)
        if drafter.disagreements:
            return False, f"{len(drafter.disagreements)} of {drafter.num_verifies} verifies differ, first: " \
                          f"{drafter.disagreements[0]}"
        diff = _first_difference(outputs, plain)
        if diff:
            return False, diff + ": a verify must accept only drafts equal to the target's argmax"
        if not drafter.num_verifies:
            return False, "the engine never asked your verify (no drafts were found): try other prompts"
        stats = summarize([r for r in engine.requests.values() if r.num_verify_steps], 1.0)
        return True, (f"output equals plain decoding token for token; your verify ran {drafter.num_verifies} "
                      f"times and accepted {stats['num_draft_accepted']} of {stats['num_draft_proposed']} "
                      f"drafts (acceptance rate {stats['acceptance_rate']:.2f}, "
                      f"{stats['mean_accepted_length']:.2f} tokens per verify step)")
    return run_check("04 your greedy verify inside the engine", test, attempted=greedy_verify is not None,
                     quiet=quiet)


# 04: a speculation policy inside the scheduler
def reference_choose_k(num_running: int, k: int) -> int:
    """k drafts while at most 2 requests run (a small batch: verify positions nearly free), else 0."""
    return k if num_running <= 2 else 0


class LearnerPolicy(SpecPolicy):
    """A SpecPolicy whose k for a step is the learner's ``choose_k(num_running, k)``; it records
    (requests running, k) for every step it decided."""

    name = "learner"

    def __init__(self, choose_k, k: int):
        super().__init__(k)
        self.fn = choose_k
        self.decisions: list[tuple[int, int]] = []

    def choose_k(self, decodes, num_running):
        k = int(self.fn(num_running, self.k))
        if decodes:
            self.decisions.append((num_running, k))
        return k


def check_04_policy_in_engine(choose_k, model=None, tokenizer=None, k: int = 4, quiet=False) -> str:
    """``choose_k`` runs as the scheduler's speculation policy over three requests that finish one
    after another: pass when every step's k follows the rule (k while at most 2 run, 0 above),
    both kinds of step happened, and the output equals plain decoding token for token."""
    def test():
        prompts = _course_prompts(tokenizer, "copy", 3)
        lengths = [8, 12, 16]
        policy = LearnerPolicy(choose_k, k)
        engine = _engine(model or tiny_course_model(), tokenizer,
                         SpecConfig(method="ngram", num_speculative_tokens=k),
                         policy=policy)
        plain = _generate(engine, prompts, lengths, plain=True)
        policy.decisions.clear()  # the plain run opted out: only the speculating run's steps count
        outputs = _generate(engine, prompts, lengths)
        wrong = [(n, got) for n, got in policy.decisions if got != reference_choose_k(n, k)]
        if wrong:
            n, got = wrong[0]
            return False, (f"with {n} requests running the policy gave k={got}; the rule asks "
                           f"{reference_choose_k(n, k)}")
        if {bool(got) for _, got in policy.decisions} != {True, False}:
            return False, "the run never had both a speculating and a plain step: check the rule's threshold"
        diff = _first_difference(outputs, plain)
        if diff:
            return False, diff
        mine = [r for r in engine.requests.values() if r.sampling_params.num_speculative_tokens is None]
        stats = summarize(mine, 1.0)
        spec_steps = sum(1 for _, got in policy.decisions if got)

        def tpot_ms(reqs) -> float:  # the mean of the requests' TPOT, each request's own
            return 1000 * sum(request_metrics(r)["tpot_s"] for r in reqs) / len(reqs)
        plain_reqs = [r for r in engine.requests.values() if r.sampling_params.num_speculative_tokens == 0]
        ours, theirs = tpot_ms(mine), tpot_ms(plain_reqs)
        return True, (f"{spec_steps} of {len(policy.decisions)} decode steps speculated (at most 2 running), "
                      f"the rest decoded plainly; acceptance rate {stats['acceptance_rate']:.2f}; output "
                      f"equals plain decoding token for token. Your policy's mean TPOT {ours:.2f} ms against "
                      f"{theirs:.2f} ms with speculation off ({theirs / ours:.2f}x; one short run of each, "
                      "so read it as a sketch: the k sweep above compares in rounds)")
    return run_check("04 your speculation policy inside the scheduler", test, attempted=choose_k is not None,
                     quiet=quiet)

