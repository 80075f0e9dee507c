"""Notebook 05's exercises (notebooks/05_messenger_vs_truck.ipynb): where a speedup curve crosses 1.0
between its measured loads, and the most fleet throughput that keeps a per-user promise on the
simulated H100.
"""

from __future__ import annotations

import functools
import math

from course.checks import check_function, run_check
from course.exercises.harness import H100
from minispec.sim import sweep


def reference_first_losing_concurrency(rows: list[dict], method: str):
    """Smallest concurrency whose speedup for ``method`` is below 1.0, else None."""
    losing = sorted(r["concurrency"] for r in rows if r["spec"] == method and r["speedup_vs_off"] < 1.0)
    return losing[0] if losing else None


def reference_crossover_concurrency(speedup: dict[int, float]) -> float | None:
    """Where the curve ``speedup`` ({concurrency: speedup over spec off}) first falls below 1.0, read
    between the two loads around the fall: linear in log2(concurrency), as the notebook's axes are.
    The smallest load when the curve starts below 1.0; None when it never falls below."""
    points = sorted(speedup.items())
    for i, (c, s) in enumerate(points):
        if s < 1.0:
            if i == 0:
                return float(c)
            c0, s0 = points[i - 1]
            t = (s0 - 1.0) / (s0 - s)  # the share of the way from c0 to c where the line meets 1.0
            return 2 ** (math.log2(c0) + t * (math.log2(c) - math.log2(c0)))
    return None


def check_05_crossover(fn, quiet=False) -> str:
    inputs = [{1: 1.6, 8: 1.2, 32: 0.95, 64: 0.8},  # falls between 8 and 32: 25.4, not 32
              {64: 0.7, 1: 1.5, 16: 1.1, 32: 0.9},  # given out of order
              {1: 1.4, 8: 1.05},  # never below 1.0
              {1: 0.9, 4: 1.1},  # below from the start
              {1: 1.5, 8: 1.0, 16: 0.8},  # exactly 1.0 at 8 is not below it
              {1: 1.3, 4: 0.9, 8: 1.2, 16: 0.7}]  # the first fall counts
    cases = [((s,), reference_crossover_concurrency(s)) for s in inputs]
    return check_function("05 where the speedup crosses 1.0", fn, cases, rel=1e-3, quiet=quiet)


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
