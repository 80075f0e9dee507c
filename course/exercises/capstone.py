"""Notebook 09's exercise (notebooks/09_capstone.ipynb): the capstone policy, judged on grade_policy's
report.
"""

from __future__ import annotations

from course.checks import run_check


def check_09_policy(result: dict | None, quiet=False) -> str:
    """``result`` is grade_policy's report: pass when, at every load, the bulk lane keeps its
    throughput goal and the interactive lane's SLO attainment reaches its target."""
    def test():
        sc = result["scores"]
        parts = [f"c={load}: bulk {s['bulk_share']:.2f} of never's throughput (goal "
                 f"{result['bulk_goal']:.2f}), interactive SLO attainment {s['attainment']:.2f} (target "
                 f"{s['attainment_target']:.2f})"
                 + ("" if s["passed"] else " <- missed") for load, s in sc.items()]
        return result["passed"], "; ".join(parts)
    return run_check("09 capstone policy", test, attempted=result is not None, quiet=quiet)
