"""The capstone's report in sentences: which policy leads or passes at each load, and why.

``grade_policy`` (course/scenarios.py) runs the two-lane mix at each load and scores every
policy on both lanes; the functions here turn its report into the chart's title and the lines under
it: each policy's attainment, TPOT and bulk share per load, the baselines that meet both goals
everywhere, and the fleet paradox (speculating everyone lowers the median TPOT while the fleet
emits less), explained per route. Each sentence is computed from the report, never fixed.
Taught in notebooks/09_capstone.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

from course.scenarios import Scenario, run_scenario

# always against never for the whole fleet: the ratios the paradox lines print, in column order
FLEET_KEYS = ("fleet_tpot_p50_s", "fleet_tpot_mean_s", "fleet_e2e_mean_s", "fleet_throughput_tok_s")


def capstone_title(report: dict, yours: bool) -> str:
    """The capstone chart's title: with ``yours`` (the report grades a learner's policy) the loads
    it passes or misses at; else the baseline that leads at each load (meets both goals, then the
    interactive attainment to two decimals, then the fleet's tokens/s).

    Args: report: ``grade_policy``'s report (``scores`` and ``lanes`` per load).
    Returns: one line of text.
    """
    scores = report["scores"]
    if yours:
        passed = [load for load, s in scores.items() if s["passed"]]
        missed = [load for load, s in scores.items() if not s["passed"]]
        return (f"Your policy passes at every load ({', '.join(f'c={c}' for c in passed)})" if not missed else
                f"Your policy misses at {', '.join(f'c={c}' for c in missed)}")

    def order(load, name):  # meets both goals, then attainment, then fleet throughput
        r = report["lanes"][load][name]
        return (scores[load]["verdicts"][name], round(r["interactive_attainment"], 2),
                r["fleet_throughput_tok_s"])

    leader = {load: max(report["lanes"][load], key=lambda n, load=load: order(load, n)) for load in scores}
    return "Baselines only; leading at each load: " + ", ".join(f"c={c} {n}" for c, n in leader.items())


def policy_lines(report: dict) -> list[str]:
    """Per load, a header with the interactive target, then one line per policy: its interactive
    attainment and p50 TPOT (ms), the bulk lane's tokens/s as a share of ``never``'s, the fleet's
    tokens/s and whether it meets both goals."""
    scores, lines = report["scores"], []
    for load, row in report["lanes"].items():
        lines.append(f"concurrency {load} (interactive target {scores[load]['attainment_target']:.2f}):")
        never_bulk = row["never"]["bulk_throughput_tok_s"]
        for name, r in row.items():
            verdict = "meets both" if scores[load]["verdicts"][name] else "misses"
            lines.append(f"  {name:>12}: attainment {r['interactive_attainment']:.2f}, interactive TPOT "
                         f"{r['interactive_tpot_p50_s'] * 1000:5.1f} ms, bulk "
                         f"{r['bulk_throughput_tok_s'] / never_bulk:.2f} of never, "
                         f"fleet {r['fleet_throughput_tok_s']:5.0f} tok/s: {verdict}")
    return lines


def threshold_notes(report: dict) -> list[str]:
    """One line per load above 16 where ``threshold:16`` emitted fewer fleet tokens/s than ``never``:
    a load-switched rule that speculated little and still fell behind. Empty when none did."""
    lines = []
    for load, row in report["lanes"].items():
        t, n = row.get("threshold:16"), row["never"]
        if t is not None and load > 16 and t["fleet_throughput_tok_s"] < n["fleet_throughput_tok_s"]:
            share = t["fleet_throughput_tok_s"] / n["fleet_throughput_tok_s"]
            lines.append(f"At c={load} threshold:16 made {share:.2f} of never's fleet tokens/s: it "
                         "speculates only while under 16 requests are in flight (the run's start and its "
                         "tail), and the simulator is exact, so those steps alone cost it the difference.")
    return lines


def everywhere_line(report: dict) -> str:
    """The baselines (not ``yours``) that meet both goals at every load, or why none does."""
    everywhere = [n for n in next(iter(report["lanes"].values()))
                  if n != "yours" and all(s["verdicts"][n] for s in report["scores"].values())]
    return "Baselines that meet both goals at every load: " + (", ".join(everywhere) if everywhere else
           "none: each fixed rule fails one lane at some load, which is what your policy has to fix.")


def moved(ratio: float) -> str:
    """How a ratio to ``never`` moved, read at the two decimals printed beside it: "rose (1.05x)",
    "fell (0.95x)" or "did not move (1.00x)", so the words never contradict the number."""
    shown = f"{ratio:.2f}x"
    return ("did not move" if shown == "1.00x" else "rose" if ratio > 1 else "fell") + f" ({shown})"


def paradox_sentence(load: int, r: dict) -> str:
    """Where ``always`` lowers the fleet's p50 TPOT while the fleet emits less (``r``: always / never
    for ``FLEET_KEYS``): what the means did, each in the direction its printed ratio shows, and the
    closed loop's reading (output follows the mean time a request holds its slot) only where the mean
    E2E rose."""
    e2e = moved(r["fleet_e2e_mean_s"])
    text = (f"At c={load} always lowers the median request's TPOT ({r['fleet_tpot_p50_s']:.2f}x) while the "
            f"fleet emits {r['fleet_throughput_tok_s']:.2f}x as much: the mean TPOT "
            f"{moved(r['fleet_tpot_mean_s'])} and the mean E2E {e2e}.")
    if e2e.startswith("rose"):
        return text + (" A closed loop's output follows the mean time a request holds its slot, and that "
                       "time grew.")
    return text + (" The mean E2E did not grow, so it does not explain the lower output on its own (what "
                   "remains is how full the batch runs at the start and the tail, which no mean shows).")


def fleet_paradox_lines(report: dict, scenario: Scenario) -> list[str]:
    """``always`` over ``never`` for the whole fleet at each load (p50 and mean TPOT, mean E2E, fleet
    tokens/s, as ratios), then, for each load where always lowers the p50 TPOT while the fleet emits
    less, the explanation per route: both policies rerun on ``scenario`` at that load (simulated,
    about a second each) for each route's p50 TPOT (ms)."""
    lines = ["Speculating everyone (always) against nobody (never), whole fleet:  p50 TPOT  mean TPOT  "
             "mean E2E  fleet tok/s"]
    paradox = []
    for load, row in report["lanes"].items():
        a, n = row["always"], row["never"]
        r = {key: a[key] / n[key] for key in FLEET_KEYS}
        lines.append(f"  c={load:<4}{'':55s}{r['fleet_tpot_p50_s']:6.2f}x {r['fleet_tpot_mean_s']:9.2f}x "
                     f"{r['fleet_e2e_mean_s']:8.2f}x {r['fleet_throughput_tok_s']:10.2f}x")
        if r["fleet_tpot_p50_s"] < 1 and r["fleet_throughput_tok_s"] < 1:
            paradox.append((load, r))
    for load, r in paradox:
        at_load = replace(scenario, concurrency=load)
        routes = {p: run_scenario(at_load, p)["routes"] for p in ("never", "always")}
        by_route = ", ".join(f"{rt} {1000 * routes['never'][rt]['tpot_p50_s']:.1f} -> "
                             f"{1000 * routes['always'][rt]['tpot_p50_s']:.1f} ms" for rt in routes["always"])
        slowest = max(routes["always"], key=lambda rt: routes["always"][rt]["tpot_p50_s"])
        lines.append(paradox_sentence(load, r) + f" Per route, p50 TPOT never -> always: {by_route}. The "
                     f"{slowest} route (alpha {scenario.routes[slowest][0]}) pays for drafts that fail, in "
                     "steps everyone shares, and sits above the median, which the other routes set.")
    return lines
