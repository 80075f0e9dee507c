"""Notebook 07's premium lane: whether it pays, said from the numbers, simulated and measured here.

A premium lane pays when its p50 TPOT is at least ``PREMIUM_TPOT_GOAL`` times lower and the bulk
lane keeps ``BULK_SHARE_GOAL`` of its throughput (the course's own goal: the notes give no number).
The verdict (``lane_verdict``), its sentences and its bars for notebooks/07_policies.ipynb's
premium-lane section; the headlines go through :func:`course.headline`. Re-exported by
course.policy_lab.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course import headline
from course.claims import explain_cost

PREMIUM_TPOT_GOAL = 1.3  # the premium lane's p50 TPOT at least this many times lower than spec off's
BULK_SHARE_GOAL = 0.9  # the bulk lane keeps at least this share of its spec-off throughput


# -- the premium lane ---------------------------------------------------------------------------------
def lane_verdict(plain: dict, run: dict) -> tuple[float, float, bool]:
    """Whether a premium lane pays, from two ``scenarios.run_scenario`` results.

    Args:
        plain: the run with speculation off; run: the run under the lane policy.
    Returns: (the premium lane's p50 TPOT speedup over spec off (x), the bulk lane's throughput as a
        share of spec off's, whether both goals are met: PREMIUM_TPOT_GOAL and BULK_SHARE_GOAL).
    """
    speedup = plain["lanes"]["interactive"]["tpot_p50_s"] / run["lanes"]["interactive"]["tpot_p50_s"]
    bulk = run["lanes"]["bulk"]["throughput_tok_s"] / plain["lanes"]["bulk"]["throughput_tok_s"]
    return speedup, bulk, speedup >= PREMIUM_TPOT_GOAL and bulk >= BULK_SHARE_GOAL


def premium_lane_text(plain: dict, premium: dict[str, dict]) -> str:
    """Spec off's lanes, then per drafter whether the premium lane pays and what the bulk lane waited
    for per decode step: the drafter's forwards, the verify rows and the rest (``StepSplit``).

    Args:
        plain: ``run_scenario`` with speculation off; premium: drafter -> ``run_scenario`` under "lane".
    Returns: one line for spec off and one per drafter, joined by newlines.
    """
    base_tpot = plain["lanes"]["interactive"]["tpot_p50_s"]
    base_bulk = plain["lanes"]["bulk"]["throughput_tok_s"]
    lines = [f"spec off: premium p50 TPOT {1000 * base_tpot:.2f} ms, bulk {base_bulk:.0f} tok/s, decode step "
             f"{1000 * plain['split']['step_s']:.2f} ms"]
    for d, r in premium.items():
        speedup, bulk, pays = lane_verdict(plain, r)
        sp = r["split"]
        lines.append(
            f"{d:>13}: premium p50 TPOT {speedup:.2f}x lower, bulk throughput {bulk:.2f} of spec off's: "
            + ("pays" if pays else "does not pay") + ". Per decode step the bulk requests waited "
            f"{1000 * sp['draft_s']:.2f} ms for the drafter's forwards and {1000 * sp['rows_s']:.2f} ms for "
            f"{sp['num_draft_rows']:.1f} verify rows, on top of {1000 * sp['rest_s']:.2f} ms of target "
            f"forward for the requests' own tokens: mostly {sp['cause']}; " + (
                "n-gram lookup runs no draft forward at all." if sp["no_draft_loop_share"] == 1 else
                f"{sp['no_draft_loop_share']:.0%} of the decode steps ran no draft loop (no premium request "
                "drafted in them)."))
    return "\n".join(lines)


def plot_lane_verdicts(plain: dict, premium: dict[str, dict]):
    """Per drafter, the premium lane's TPOT speedup and the bulk lane's share of its throughput as
    bars, the goals dotted.

    Args:
        plain: ``run_scenario`` with speculation off; premium: drafter -> ``run_scenario`` under "lane".
    Returns: the figure; its title (the drafters that pay) is recorded as a headline.
    """
    verdict = {d: lane_verdict(plain, r) for d, r in premium.items()}
    names = list(premium)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([i - 0.2 for i in range(len(names))], [verdict[d][0] for d in names], 0.4,
           label="premium TPOT speedup (x)")
    ax.bar([i + 0.2 for i in range(len(names))], [verdict[d][1] for d in names], 0.4,
           label="bulk throughput (of spec off)")
    ax.axhline(PREMIUM_TPOT_GOAL, color="C0", ls=":", lw=1)
    ax.axhline(BULK_SHARE_GOAL, color="C1", ls=":", lw=1)
    ax.set_xticks(range(len(names)), names)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    pays = [d for d in names if verdict[d][2]]
    others = ", ".join(f"{d} bulk {verdict[d][1]:.2f}" for d in names if d not in pays)
    ax.set_title(headline("15% premium lane at c=32: pays with " + (", ".join(pays) if pays else "no drafter")
                          + "; " + others), fontsize=9)
    return fig


def draft_wait_text(split: dict, hardware) -> str:
    """How much of the bulk lane's wait for a 1B draft's four forwards is the engine's fixed time.

    Args:
        split: the 1B draft run's ``StepSplit.mean()`` (``draft_s``: seconds per decode step).
        hardware: the simulated device (``step_overhead_s``, ``draft_forward_overhead_s``: seconds).
    """
    per_forward_ms = 1000 * hardware.draft_forward_overhead_s
    return (f"The 1B draft's four forwards each pay the engine's fixed {per_forward_ms:.2f} ms per draft "
            f"forward, {1000 * (4 * hardware.draft_forward_overhead_s):.2f} ms of the "
            f"{1000 * split['draft_s']:.2f} ms the bulk lane waited per step for them, on top of the "
            f"{1000 * hardware.step_overhead_s:.2f} ms every engine step pays. That wait is unavoidable "
            "while both lanes share one synchronous batch; it shrinks with a drafter whose forwards cost "
            "little (a head) or none (n-gram), with a smaller premium share (fewer steps hold a drafting "
            "request) and wherever no request of a step drafts, since neither the engine nor the simulator "
            "runs the draft loop then.")


def premium_here_text(speedup: float, bulk_share: float, added: dict) -> str:
    """The premium lane measured on this machine: the verdict (a headline), what the bulk requests
    waited for, why it misses the goal where it does, and a warning where a number sits near its goal.

    Args:
        speedup: the premium request's p50 TPOT, all-plain over speculating (x).
        bulk_share: the bulk lane's token rate speculating, as a share of the all-plain one.
        added: ``claims.neighbour_cost`` of the two runs' decode steps (seconds by part, ``cause``).
    Returns: the lines, joined by newlines.
    """
    paid = speedup >= PREMIUM_TPOT_GOAL and bulk_share >= BULK_SHARE_GOAL
    lines = [headline(f"Here, n-gram, 1 premium request of 7: premium p50 TPOT {speedup:.2f}x lower, bulk "
                      f"keeps {bulk_share:.2f} of its all-plain token rate: "
                      + ("pays." if paid else "misses the goal (1.3x, 0.9).")),
             f"What the bulk requests waited for: {explain_cost(added)}."]
    if not paid:
        why = []
        if speedup < PREMIUM_TPOT_GOAL:
            why.append(f"the premium request gained only {speedup:.2f}x: its drafts are checked in a "
                       "forward that on this CPU costs about what its rows' arithmetic costs, so each verify "
                       "is dearer than on a GPU's idle compute")
        if bulk_share < BULK_SHARE_GOAL:
            why.append(f"the bulk lane paid {added['step_s'] / added['plain_step_s']:+.0%} per step, mostly "
                       f"{added['cause']}")
        lines.append("Why it misses here: " + "; ".join(why) + ". The H100 model above prices the same rows "
                     "on a step that is memory-bound, where they ride on idle compute.")
    near_bulk = abs(bulk_share - BULK_SHARE_GOAL) < 0.07
    if near_bulk or abs(speedup - PREMIUM_TPOT_GOAL) < 0.3:
        lines.append("Read this verdict as close: one run of each, and "
                     f"{'the bulk share' if near_bulk else 'the premium gain'} sits near its goal. The "
                     "course's reference runs read 'pays' on a quiet machine and a bulk share of 0.88 with "
                     "one core kept busy (bench/results/course_headlines.json): on a laptop expect either, "
                     "and rerun on a quiet one.")
    return "\n".join(lines)
