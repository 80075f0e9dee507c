"""Notebook 06's exercises (notebooks/06_what_speculation_costs.ipynb): a plain request's slowdown
beside speculating neighbours (checked on the simulated H100) and a draft tree's verify cost read
from a step-time curve.
"""

from __future__ import annotations

from course.checks import run_check
from course.claims import neighbours
from course.exercises.harness import H100, h100_cost
from minispec.base.config import EngineConfig, SpecConfig
from minispec.sim import build_sim_engine


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
