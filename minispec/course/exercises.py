"""Reference answers and check functions for the notebooks' exercises.

Each ``check_*`` function takes the learner's answer (``None`` = not attempted) and returns
"pass", "fail" or "not attempted" (see minispec.course.checks). Expected values are computed
from formulas here, never typed in, so the checks follow the inputs the notebook used.
"""

from __future__ import annotations

import math

from minispec.course.checks import check_function, check_number, run_check
from minispec.sim.costmodel import expected_accepted_length, leviathan_speedup


# -- 00 quickstart ------------------------------------------------------------------------------
def decode_roofline_tok_s(weight_bytes: float, bandwidth_bytes_s: float) -> float:
    """Upper bound on batch-1 decode steps per second: every step reads every weight once."""
    return bandwidth_bytes_s / weight_bytes


def check_00_roofline(answer, weight_bytes: float, bandwidth_bytes_s: float = 25e9, quiet=False) -> str:
    return check_number("00 decode roofline (tokens/s)", answer, decode_roofline_tok_s(weight_bytes, bandwidth_bytes_s),
                        rel=0.05, hint="Divide bytes per second by bytes read per step.", quiet=quiet)


# -- 01 decode is memory-bound ------------------------------------------------------------------
def ridge_point_tokens(flops_per_s: float, bandwidth_bytes_s: float, bytes_per_weight: float) -> float:
    """Tokens per step where a step's weight FLOPs (2 per weight per token) take as long as reading
    the weights once: 2 * n / flops = bytes_per_weight / bandwidth (Williams et al. 2009, roofline)."""
    return flops_per_s * bytes_per_weight / (2 * bandwidth_bytes_s)


def check_01_ridge(answer, flops_per_s: float, bandwidth_bytes_s: float, bytes_per_weight: float, quiet=False) -> str:
    return check_number("01 ridge point (tokens per step)", answer,
                        ridge_point_tokens(flops_per_s, bandwidth_bytes_s, bytes_per_weight), rel=0.05,
                        hint="Set compute time 2*P*n/FLOPs equal to memory time P*bytes/bandwidth and solve for n.",
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


# -- 05 messenger against truck -----------------------------------------------------------------
def reference_first_losing_concurrency(rows: list[dict], method: str):
    """Smallest concurrency whose speedup for ``method`` is below 1.0, else None."""
    losing = sorted(r["concurrency"] for r in rows if r["spec"] == method and r["speedup_vs_off"] < 1.0)
    return losing[0] if losing else None


def check_05_crossover(fn, quiet=False) -> str:
    def rows(speedups):
        return [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in speedups] + \
               [{"spec": "off", "concurrency": c, "speedup_vs_off": 1.0} for c, _ in speedups]
    cases = [((rows([(1, 1.6), (8, 1.2), (32, 0.95), (64, 0.8)]), "draft"), 32),
             ((rows([(64, 0.7), (1, 1.5), (16, 1.1), (32, 0.99)]), "draft"), 32),
             ((rows([(1, 1.4), (8, 1.05)]), "draft"), None),
             ((rows([(1, 0.9), (4, 1.1)]), "draft"), 1)]
    return check_function("05 first concurrency where speculation loses", fn, cases, quiet=quiet)


# -- 06 policies ---------------------------------------------------------------------------------
def reference_threshold(rows: list[dict], method: str) -> int:
    """Largest concurrency below the first losing one (the N for a threshold:N policy)."""
    first = reference_first_losing_concurrency(rows, method)
    ok = [r["concurrency"] for r in rows if r["spec"] == method and (first is None or r["concurrency"] < first)]
    return max(ok) if ok else 0


def check_06_threshold(fn, quiet=False) -> str:
    def rows(speedups):
        return [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in speedups]
    cases = [((rows([(1, 1.6), (8, 1.2), (32, 0.95), (64, 0.8)]), "draft"), 8),
             ((rows([(1, 1.6), (8, 1.2), (16, 1.01), (32, 1.2), (64, 0.8)]), "draft"), 32),
             ((rows([(1, 0.9), (4, 0.8)]), "draft"), 0),
             ((rows([(1, 1.3), (128, 1.1)]), "draft"), 128),
             ((rows([(1, 1.5), (8, 0.9), (32, 1.05), (64, 0.8)]), "draft"), 1)]  # a win after a loss
    return check_function("06 threshold from a speedup curve", fn, cases, quiet=quiet)


# -- 07 capstone ---------------------------------------------------------------------------------
def check_07_policy(result: dict | None, quiet=False) -> str:
    """``result`` is grade_policy's report: pass when the policy reaches 90% of the better of
    never and always at every load (short simulated runs carry a few percent of noise)."""
    def test():
        worst = min(result["scores"].values())
        return worst >= 0.9, (f"worst load: {worst:.2f} of the better of never/always "
                               f"({', '.join(f'{k}: {v:.2f}' for k, v in result['scores'].items())})")
    return run_check("07 capstone policy", test, attempted=result is not None, quiet=quiet)
