"""Exercise checks that report pass, fail or not attempted, and never crash the notebook.

An exercise stub sets its answer to ``None`` (or leaves a function raising NotImplementedError);
the check then says "not attempted". Any exception inside a learner's code is reported as a
failure with its message, never raised.
"""

from __future__ import annotations

import math
from typing import Callable

PASS, FAIL, NOT_ATTEMPTED = "pass", "fail", "not attempted"


def run_check(name: str, test: Callable[[], tuple[bool, str]], attempted: bool = True,
              quiet: bool = False) -> str:
    """Run ``test`` (returns (ok, message)) and print one line. Returns PASS, FAIL or NOT_ATTEMPTED."""
    if not attempted:
        result, message = NOT_ATTEMPTED, "fill in the exercise, then run this cell again"
    else:
        try:
            ok, message = test()
            result = PASS if ok else FAIL
        except NotImplementedError:
            result, message = NOT_ATTEMPTED, "the function still raises NotImplementedError"
        except Exception as exc:  # a learner's bug is a failed check, not a crashed notebook
            result, message = FAIL, f"{type(exc).__name__}: {exc}"
    if not quiet:
        mark = {PASS: "PASS", FAIL: "FAIL", NOT_ATTEMPTED: "NOT ATTEMPTED"}[result]
        print(f"[{mark}] {name}: {message}")
    return result


def close(value, expected: float, rel: float = 0.05, abs_tol: float = 0.0) -> bool:
    return (value is not None and math.isfinite(float(value))
            and math.isclose(float(value), expected, rel_tol=rel, abs_tol=abs_tol))


def check_number(name: str, value, expected: float, rel: float = 0.05, hint: str = "",
                 quiet: bool = False) -> str:
    """Check a numeric answer within a relative tolerance."""
    def test():
        ok = close(value, expected, rel)
        return ok, (f"{float(value):.4g} is within {rel:.0%} of the expected value" if ok else
                    f"{shown(value)} is not within {rel:.0%} of the expected value. {hint}".strip())
    return run_check(name, test, attempted=value is not None, quiet=quiet)


def shown(value) -> str:
    """A value as a check prints it: a float to 4 significant figures (not 5.807902118996268)."""
    return f"{value:.4g}" if isinstance(value, float) else repr(value)


def check_function(name: str, fn: Callable | None, cases: list[tuple[tuple, object]], rel: float = 1e-6,
                   quiet: bool = False) -> str:
    """Check ``fn(*args) == expected`` for every case (numbers within ``rel``)."""
    def test():
        for args, expected in cases:
            got = fn(*args)
            same = close(got, expected, rel, 1e-12) if isinstance(expected, float) else got == expected
            if not same:
                return False, f"{fn.__name__}{args} returned {shown(got)}, expected {shown(expected)}"
        return True, f"all {len(cases)} cases agree"
    return run_check(name, test, attempted=fn is not None, quiet=quiet)
