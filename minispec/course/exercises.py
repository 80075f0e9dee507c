"""Reference answers and check functions for the notebooks' exercises.

Each ``check_*`` function takes the learner's answer (``None`` = not attempted) and returns
"pass", "fail" or "not attempted" (see minispec.course.checks). Expected values are computed
from formulas here, never typed in, so the checks follow the inputs the notebook used.
"""

from __future__ import annotations

import math

from minispec.course.checks import check_function, check_number, run_check


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
    """Mean tokens emitted per verify step, bonus included: (1 - alpha^(k+1)) / (1 - alpha)
    (Leviathan et al. 2023, eq. 1), k + 1 when alpha = 1."""
    return k + 1.0 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Walltime improvement at batch 1 when a draft step costs c target steps (Leviathan et al.
    2023, Theorem 3.8): (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1))."""
    return expected_tokens_per_step(alpha, k) / (k * c + 1)


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
