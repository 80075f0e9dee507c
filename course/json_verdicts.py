"""Notebook 08's JSON route with a real grammar: its table and verdict sentences, from the numbers.

Each run of the route (``json_lab.measure_json_route``, in rounds) becomes a table row and the
sentences printed under it in notebooks/08_json_routes.ipynb: the grammar's share of a step, how it
moved alpha, and whether opting the route out of speculation pays, judged with ``noise.compare``.
Re-exported by course.policy_lab.
"""

from __future__ import annotations

from course import headline
from course.noise import DEAD_ZONE, Verdict, round_median


def _fmt(x: float | None, fmt: str) -> str:
    """``x`` formatted with ``fmt``, or "-" when it is None (a run with no verify step)."""
    return "-" if x is None else format(x, fmt)


# -- the JSON route with a real grammar ---------------------------------------------------------------
def median_of_runs(runs: list[dict], key: str) -> float | None:
    """The middle over the rounds of ``run[key]`` (the upper of two middles), or None where the first
    round has none (a spec-off run has no verify step to count).

    Args:
        runs: one ``json_lab.measure_json_route`` dict per round (at least one).
        key: the measurement, e.g. "alpha" or "step_s" (seconds).
    """
    return round_median([run[key] for run in runs]) if runs[0][key] is not None else None


def json_route_table(json_runs: dict[tuple[str, str], list[dict]],
                     json_tputs: dict[tuple[str, str], list[float]], num_prompts: int) -> list[dict]:
    """The JSON route's runs as table rows for ``show_table``, one per (drafter, arm).

    Args:
        json_runs: (drafter, arm) -> one ``measure_json_route`` dict per round.
        json_tputs: (drafter, arm) -> tokens/s per round.
        num_prompts: the route's prompts (each run's ``num_valid_json`` counts out of it).
    Returns: rows with alpha, tokens and forced drafts per verify step, the step split (ms), tokens/s
        and the documents that validate, formatted ("-" where a run has no verify step).
    """
    def mid(cell, key):
        return median_of_runs(json_runs[cell], key)

    def step_ms(cell):
        return (f"{1000 * mid(cell, 'step_s'):.0f} ({1000 * mid(cell, 'draft_s'):.0f} / "
                f"{1000 * mid(cell, 'target_s'):.0f} / {1000 * mid(cell, 'grammar_s'):.1f})")

    return [{"drafter": d, "arm": a, "alpha": _fmt(mid((d, a), "alpha"), ".2f"),
             "tokens / verify": _fmt(mid((d, a), "mean_accepted_length"), ".2f"),
             "forced / verify": _fmt(mid((d, a), "forced_per_verify_step"), ".2f"),
             "step ms (draft / target / grammar)": step_ms((d, a)),
             "tok/s": f"{round_median(json_tputs[(d, a)]):.0f}",
             "valid JSON": f"{json_runs[(d, a)][-1]['num_valid_json']}/{num_prompts}"} for d, a in json_runs]


def grammar_share_text(json_runs: dict[tuple[str, str], list[dict]], concurrency: int) -> str:
    """The share of a spec-off decode step that the grammar's masks took.

    Args:
        json_runs: (drafter, arm) -> one ``measure_json_route`` dict per round, with ("spec off", "grammar").
        concurrency: the requests in flight (for the sentence).
    """
    base = json_runs[("spec off", "grammar")]
    share = median_of_runs(base, "grammar_s") / median_of_runs(base, "step_s")
    return f"The grammar's masks took {share:.1%} of a spec-off decode step at concurrency {concurrency}."


def split_reading(predicted: float, measured: float) -> str:
    """The step split's prediction (tokens per verify step over the growth of the mean step) beside the
    measured speedup (the median of the rounds' ratios), read as an estimate and never as a bound: tokens
    per verify counts verify steps alone, while the mean step and tokens/s count every step, prefills and
    the run's tail with fewer requests included, so the measurement can land on either side of it."""
    if abs(measured / predicted - 1) <= DEAD_ZONE:
        return f"the split predicts about {predicted:.2f}x, in line with the {measured:.2f}x measured."
    side = "agree on the direction" if (predicted > 1) == (measured > 1) else "disagree on the direction"
    return (f"the split predicts about {predicted:.2f}x against {measured:.2f}x measured, more than "
            f"{DEAD_ZONE:.0%} apart; they {side}. Tokens per verify leave the prefill steps and the run's "
            "tail out, tokens/s does not, so trust the measured ratio.")


def json_verdict_text(json_verdicts: dict[tuple[str, str], Verdict],
                      json_runs: dict[tuple[str, str], list[dict]],
                      json_tputs: dict[tuple[str, str], list[float]]) -> str:
    """Does opting JSON out pay? Per (drafter, grammar arm) the verdict against spec off under the
    grammar (a headline) and what the step split offered; per drafter how the grammar moved alpha;
    then per drafter the notes' advice, judged on its faster grammar arm.

    Args:
        json_verdicts: (drafter, arm) -> ``noise.compare`` of its tokens/s against spec off's under the
            grammar, for the arms "grammar" and "grammar+jump".
        json_runs: (drafter, arm) -> one ``measure_json_route`` dict per round, for those arms, "free"
            and ("spec off", "grammar").
        json_tputs: (drafter, arm) -> tokens/s per round.
    Returns: the lines, joined by newlines.
    """
    def mid(cell, key):
        return median_of_runs(json_runs[cell], key)

    base = ("spec off", "grammar")
    drafters = list(dict.fromkeys(d for d, _ in json_verdicts))
    lines = []
    for (d, a), v in json_verdicts.items():
        length = mid((d, a), "mean_accepted_length") or 1.0
        grew = mid((d, a), "step_s") / mid(base, "step_s")
        drafting = mid((d, a), "draft_s") / mid((d, a), "step_s")
        lines.append(headline(f"JSON route, {d}, {a}: " + v.text()) + f". Each verify emitted {length:.2f} "
                     f"tokens, the step grew {grew:.2f}x (the drafter {drafting:.0%} of it): "
                     + split_reading(length / grew, v.ratio))
    for d in drafters:
        free, tight = mid((d, "free"), "alpha"), mid((d, "grammar"), "alpha")
        forced = mid((d, "grammar+jump"), "forced_per_verify_step")
        lines.append(f"{d}: the grammar moved alpha from {_fmt(free, '.2f')} (free) to {_fmt(tight, '.2f')}; "
                     f"jump-forward added {_fmt(forced, '.2f')} forced drafts per verify step.")
    for d in drafters:
        best = max(("grammar", "grammar+jump"), key=lambda a: round_median(json_tputs[(d, a)]))
        v = json_verdicts[(d, best)]
        if v.finding == "higher":
            lines.append(f"With {d}: the notes' advice does not hold here. Under the grammar ({best}) "
                         f"speculation beat spec off in every round ({v.spread_text()}): keys, braces and "
                         "quotes are forced or copied from the prompt, so the route is predictable and "
                         "opting it out would give up real speed.")
        elif v.finding in ("lower", "probably lower"):
            lines.append(f"With {d}: the notes' advice holds here. Even at its best ({best}) speculation on "
                         f"the JSON route measured {v.spread_text()} against spec off: its wider steps cost "
                         "more than its accepted drafts bring, so opting the route out loses nothing.")
        else:
            lines.append(f"With {d}: no clear gain either way on this run (best, {best}: {v.text()}): the "
                         "accepted drafts about pay for the wider steps, so opting the route out costs "
                         "little here; whether it pays at scale depends on the route's alpha and the load, "
                         "which the simulator lines below vary.")
    return "\n".join(lines)
