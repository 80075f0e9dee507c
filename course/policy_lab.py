"""Notebooks 07 and 08's plots and verdict sentences: when a speculation policy pays, said from the numbers.

Each experiment of notebooks/07_policies.ipynb (policies by load and by lane) and
notebooks/08_json_routes.ipynb (by route) runs in its
cell; this module draws what it measured and writes the sentences printed under it, the words chosen
by the numbers (a loss, a tie, a gain the step split explains), so a cell reads as the run it makes.
No sentence is fixed; the headlines go through :func:`course.headline`, which records them
for bench/course/course_budget.py. A premium lane pays when its p50 TPOT is at least ``PREMIUM_TPOT_GOAL``
times lower and the bulk lane keeps ``BULK_SHARE_GOAL`` of its throughput (the course's own goal: the
notes give no number).

This module holds the policies by load (mistake 1's threshold sweep, the failure-modes lab's
thrash, mistake 3's goodput and poor acceptance); the premium lane's verdicts live in
course.lane_verdicts and the JSON route's in course.json_verdicts, both re-exported here so that
the notebook imports every helper from course.policy_lab.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course import headline
from course.json_verdicts import (
    _fmt, grammar_share_text, json_route_table, json_verdict_text, median_of_runs,
)
from course.lane_verdicts import (
    BULK_SHARE_GOAL, PREMIUM_TPOT_GOAL, draft_wait_text, lane_verdict, plot_lane_verdicts, premium_here_text,
    premium_lane_text,
)
from course.noise import DEAD_ZONE, Verdict, round_median
from course.plots import speedup_axes

THRESHOLD = 16  # the fix for mistake 1, "threshold:16": speculate while at most 16 requests are held


# -- mistake 1: speculation fleet-wide after a concurrency-1 win -------------------------------------
def plot_threshold_sweep(grid: list[int], always: list[float], gated: list[float]):
    """Throughput speedup over spec off against concurrency, for always and threshold:16.

    Args:
        grid: the concurrencies swept, ascending.
        always, gated: speedup over spec off (x) at each concurrency, always's and threshold:16's.
    Returns: the figure; its title (the speedups at both ends) is recorded as a headline.
    """
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(grid, always, marker="o", label="always")
    ax.plot(grid, gated, marker="s", label="threshold:16")
    speedup_axes(ax, "throughput speedup over spec off")
    ax.set_title(headline(f"always: {always[0]:.2f}x at c={grid[0]}, {always[-1]:.2f}x at c={grid[-1]}; "
                          f"threshold:16: {gated[0]:.2f}x, {gated[-1]:.2f}x"), fontsize=9)
    ax.legend()
    return fig


def threshold_sweep_text(grid: list[int], always: list[float], gated: list[float], hardware) -> str:
    """Where always stops paying (against the notes' concurrency 32), what threshold:16 kept above 16
    requests, and the device's fixed times that price a draft's forwards.

    Args:
        grid: the concurrencies swept, ascending; must hold 32 and one above 16.
        always, gated: speedup over spec off (x) at each concurrency, always's and threshold:16's.
        hardware: the simulated device (``step_overhead_s``, ``draft_forward_overhead_s``: seconds).
    Returns: four lines, joined by newlines.
    """
    losing = [c for c, s in zip(grid, always) if s < 1.0]
    at32 = always[grid.index(32)]
    lines = [f"At concurrency 32, the load the notes name, always ran {at32:.2f}x spec off" + (
        ": the mistake shows there." if at32 < 1.0 else
        ": on this simulated H100 (alpha 0.7, k 4, a 1B draft) speculating still paid at 32, so the notes' "
        "32 is a rule of thumb, not a constant. Where the loss starts moves with alpha, k and the "
        "draft's cost" + (f"; in this run from concurrency {losing[0]}, which is where the fix has to act."
                          if losing else "; in this run it never came."))]
    lines.append("always: " + (
        f"below 1.0 from concurrency {losing[0]}, down to {min(always):.2f}x." if losing else
        f"never below 1.0 up to concurrency {grid[-1]} in this run."))
    above = [(c, s) for c, s in zip(grid, gated) if c > THRESHOLD]
    always_above = [(c, s) for c, s in zip(grid, always) if c > THRESHOLD]
    gave_up = any(s > g + 0.03 for c, s, g in zip(grid, always, gated) if c > THRESHOLD)
    lines.append("threshold:16 above 16 requests: " + ", ".join(f"{s:.2f}x at c={c}" for c, s in above)
                 + f"; lowest {min(s for _, s in above):.2f}x, where always fell to {min(always):.2f}x. "
                 + "always above 16: " + ", ".join(f"{s:.2f}x at c={c}" for c, s in always_above)
                 + (" (speculating still paid at some of those loads: the threshold gave that up to stay "
                    "safe at the top)" if gave_up else "") + ".")
    step_ms, draft_ms = 1000 * hardware.step_overhead_s, 1000 * hardware.draft_forward_overhead_s
    lines.append(f"The engine's fixed times on this simulated H100: {step_ms:.2f} ms per engine step, "
                 f"{draft_ms:.2f} ms per draft forward: a 1B draft's k = 4 forwards cost at least "
                 f"{4000 * hardware.draft_forward_overhead_s:.2f} ms of fixed time per step before their "
                 "weight reads.")
    return "\n".join(lines)


# -- failure-modes lab: a threshold that thrashes -----------------------------------------------------
def lab_table(lab: dict[str, tuple[dict, list]]) -> list[dict]:
    """The lab's runs at c=32 as table rows for ``show_table``.

    Args:
        lab: name -> (the run's summary, its StepStats per step), as ``scenarios.policy_run`` returns.
    Returns: one row per run: p90 TPOT (ms), throughput (tokens/s), the steps that speculated and the
        largest draft catch-up (tokens), formatted.
    """
    return [{"c=32": name, "p90 TPOT ms": f"{1000 * s['tpot_p90_s']:.2f}",
             "tok/s": f"{s['throughput_tok_s']:.0f}",
             "steps that speculated": sum(1 for st in steps if st.spec_k),
             "largest catch-up (tokens)": max((st.num_draft_catch_up_tokens for st in steps), default=0)}
            for name, (s, steps) in lab.items()]


def _spiky(steps: list) -> list:
    """The steps that speculated while more requests than the threshold were held."""
    return [st for st in steps if st.spec_k and st.num_held > THRESHOLD]


def plot_thrash(old_steps: list, old: dict, off: dict, window: int = 40):
    """The old count's run, its first and last ``window`` steps: the requests held, the requests
    decoding, the steps that speculated (red) and each one's draft catch-up (tokens).

    Args:
        old_steps: StepStats per step of the old count's run: ``window`` steps or more, at least one
            of them speculating above the threshold.
        old, off: the summaries of the old count's run and of spec off's (``tpot_p90_s``: seconds).
    Returns: the figure; its title is recorded as a headline.
    """
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.6), sharey=True)
    spans = ((0, window), (len(old_steps) - window, len(old_steps)))
    for ax, (lo, hi), where in zip(axes, spans, ("start", "end")):
        xs = range(lo, hi)
        ax.plot(xs, [old_steps[i].num_held for i in xs], label="requests held (the load the fix reads)")
        ax.plot(xs, [old_steps[i].num_decodes for i in xs], label="requests decoding (the old count)")
        ax.axhline(THRESHOLD, color="grey", ls="--", lw=1, label="threshold 16")
        spec = [i for i in xs if old_steps[i].spec_k]
        ax.scatter(spec, [old_steps[i].num_decodes for i in spec], color="red", zorder=3,
                   label="speculated (k = 4)")
        for i in spec:
            ax.annotate(f"catch-up {old_steps[i].num_draft_catch_up_tokens}", (i, old_steps[i].num_decodes),
                        fontsize=7, textcoords="offset points", xytext=(4, -12))
        ax.set_xlabel(f"engine step ({where} of the run)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("requests")
    axes[0].legend(fontsize=7)
    spiky = _spiky(old_steps)
    fig.suptitle(headline(f"The old count at c=32: {len(spiky)} steps speculated while "
                          f"{min(st.num_held for st in spiky)}+ requests were held, the draft catching up on "
                          f"up to {max(st.num_draft_catch_up_tokens for st in spiky)} tokens; p90 TPOT "
                          f"{1000 * old['tpot_p90_s']:.2f} ms against spec off's "
                          f"{1000 * off['tpot_p90_s']:.2f}"),
                 fontsize=9)
    fig.tight_layout()
    return fig


def thrash_text(old_steps: list, old: dict, off: dict) -> str:
    """What the slowest step that speculated above the threshold cost, and the run's p90 TPOT change.

    Args:
        old_steps: StepStats per step of the old count's run (one speculating above the threshold).
        old, off: the summaries of the old count's run and of spec off's (``tpot_p90_s``: seconds).
    """
    worst = max(_spiky(old_steps), key=lambda st: st.duration_s)
    return (f"The slowest of those steps took {1000 * worst.duration_s:.0f} ms, "
            f"{1000 * worst.draft_time_s:.0f} ms of it the draft catching up on "
            f"{worst.num_draft_catch_up_tokens} tokens (chunked under the token budget of 8,192, as a prompt "
            "is): every request in it waited, and a few such steps cost the run "
            f"{old['tpot_p90_s'] / off['tpot_p90_s'] - 1:+.0%} on p90 TPOT. The fixed threshold:16 never "
            "speculated while more than 16 requests were held.")


# -- mistake 3: speculation left on for a JSON route with poor acceptance -----------------------------
def _goodput(rows: list[dict]) -> tuple[dict[str, float], list[str]]:
    """Policy -> goodput (requests/s), and the policies ranked by it, best first."""
    goodput = {r["policy"]: r["goodput_rps"] for r in rows}
    return goodput, sorted(goodput, key=goodput.get, reverse=True)


def plot_policy_goodput(rows: list[dict], concurrency: int):
    """Each policy's goodput (requests/s meeting the SLOs) as a horizontal bar, the best in green.

    Args:
        rows: ``scenarios.compare_policies`` rows, among them "never", "always" and "lane".
        concurrency: the load they ran at (for the title).
    Returns: the figure; its title is recorded as a headline.
    """
    goodput, ranked = _goodput(rows)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.barh(list(goodput)[::-1], list(goodput.values())[::-1],
            color=["C2" if p == ranked[0] else "C0" for p in list(goodput)[::-1]])
    ax.set_xlabel("goodput (requests/s meeting the SLOs)")
    ax.set_title(headline(f"Concurrency {concurrency}: best is {ranked[0]} ({goodput[ranked[0]]:.1f} req/s); "
                          f"never {goodput['never']:.1f}, always {goodput['always']:.1f}, "
                          f"lane {goodput['lane']:.1f}"), fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    return fig


def opt_out_text(opt: dict[int, dict[str, dict]]) -> str:
    """What opting the JSON route out did at each load: the step split before and after, the JSON
    requests' tokens per verify step, whether it paid; then a headline over the loads 32 and 128.

    Args:
        opt: concurrency -> {"always": row, "opted out": row}, ``compare_policies`` rows (their
            ``split``: seconds per decode step; ``routes``: per-route summaries); must hold 32 and 128.
    Returns: two lines per load and the headline, joined by newlines.
    """
    lines = []
    for c, r in opt.items():
        on, out = r["always"], r["opted out"]
        a, b = on["split"], out["split"]
        json_on, json_out = on["routes"]["json"], out["routes"]["json"]
        gain = out["throughput_tok_s"] / on["throughput_tok_s"] - 1
        lines.append(
            f"c={c}: opting JSON out took a decode step from {1000 * a['step_s']:.2f} to "
            f"{1000 * b['step_s']:.2f} ms (draft forwards {1000 * a['draft_s']:.2f} -> "
            f"{1000 * b['draft_s']:.2f} ms, verify rows "
            f"{1000 * a['rows_s']:.2f} -> {1000 * b['rows_s']:.2f} ms), while each JSON verify had emitted "
            f"{json_on['mean_accepted_length']:.2f} tokens and now a plain step emits 1 (JSON p50 TPOT "
            f"{1000 * json_on['tpot_p50_s']:.1f} -> {1000 * json_out['tpot_p50_s']:.1f} ms); fleet "
            f"throughput {gain:+.1%}, goodput {out['goodput_rps'] / on['goodput_rps'] - 1:+.1%}.")
        saved = 1 - b["step_s"] / a["step_s"]
        lost = 1 - 1 / json_on["mean_accepted_length"]
        lines.append("  " + (
            f"It paid: every request's decode step got {saved:.0%} shorter (the JSON route's drafts were a "
            f"large share of a packed step's work), more than the JSON requests lost: {lost:.0%} of their "
            "tokens per step." if gain > 0.01 else
            f"It did not pay: every request's decode step got {saved:.0%} shorter, but the JSON requests "
            f"lost {lost:.0%} of their tokens per step, and in a closed loop a slower request holds its "
            "client's slot longer; they still wait for the drafter's forwards that the chat and batch "
            "requests need."))
    gain = {c: opt[c]["opted out"]["throughput_tok_s"] / opt[c]["always"]["throughput_tok_s"] - 1
            for c in (32, 128)}
    lines.append(headline(f"The JSON opt-out: {gain[32]:+.1%} fleet throughput at 32 requests, "
                          f"{gain[128]:+.1%} at 128"))
    return "\n".join(lines)


def goodput_policy_text(rows: list[dict]) -> str:
    """Where the goodput policy ranked, and how a token-rate optimum can miss requests' SLOs.

    Args:
        rows: ``scenarios.compare_policies`` rows, among them "goodput" and "never".
    """
    _, ranked = _goodput(rows)
    row = {r["policy"]: r for r in rows}
    share = {p: r["interactive_goodput_rps"] / r["interactive_request_throughput_rps"]
             for p, r in row.items()}
    most_done = max(row, key=lambda p: row[p]["request_throughput_rps"])
    return (f"The goodput policy ranked {ranked.index('goodput') + 1} of {len(ranked)}. It maximises "
            "expected tokens per second (a token-rate goodput, as in SmartSpec), not requests meeting SLOs: "
            f"{share['goodput']:.0%} of its interactive requests met the SLOs, against {share['never']:.0%} "
            f"under never; the most requests finished per second under {most_done} "
            f"({row[most_done]['request_throughput_rps']:.1f}). The lane policy is the subject of the "
            "premium-lane section below.")


def poor_acceptance_text(poor: dict[int, dict[str, list[dict]]], verdicts: dict[int, Verdict]) -> str:
    """Mistake 3 measured: each load's acceptance and step time with its verdict (a headline), what
    concurrency 8's verdict means, and for a clear gain whether the step split explains it.

    Args:
        poor: concurrency -> {"off": [summary per round], "ngram": [...]}, ``claims.throughput``'s
            summaries (``acceptance_rate``, ``mean_accepted_length``, ``mean_step_s`` in seconds);
            must hold 8.
        verdicts: concurrency -> n-gram's tokens/s against spec off's (``noise.compare``).
    Returns: the lines, joined by newlines.
    """
    def step_s(runs):
        return round_median([x["mean_step_s"] for x in runs])

    lines = []
    for c, r in poor.items():
        rate = round_median([x["acceptance_rate"] or 0 for x in r["ngram"]])
        length = round_median([x["mean_accepted_length"] or 1 for x in r["ngram"]])
        lines.append(f"concurrency {c}: acceptance rate {rate:.2f}, mean accepted length {length:.2f} tokens "
                     f"per verify step; mean step {step_s(r['off']) * 1000:.0f} -> "
                     f"{step_s(r['ngram']) * 1000:.0f} ms; "
                     + headline(f"n-gram at an acceptance rate of {rate:.2f}, concurrency {c}: "
                                + verdicts[c].text()))
    fatter = step_s(poor[8]["ngram"]) / step_s(poor[8]["off"])
    finding = verdicts[8].finding
    lines.append(f"With few drafts accepted, each step was {fatter:.2f}x as long at concurrency 8. " + (
        "Speculation made the requests slower in every round: steps fatter for no gain, the mistake."
        if finding == "lower" else
        "The rounds disagreed, so this run cannot tell a gain from a loss: at an acceptance rate this low "
        "the effect is smaller than the wobble of a shared CPU, and 'no clear gain' is itself the reason to "
        "turn it off." if finding == "noisy" else
        "Speculation neither helped nor hurt measurably: the accepted drafts about paid for the wider steps, "
        "so it buys nothing here, and the simulated H100 above shows the loss at scale."
        if finding == "tie" else
        "Speculation still came out ahead in every round: on this CPU the engine's fixed per-step work "
        "dominates a step at this load, so a few accepted drafts pay for the extra positions; the simulated "
        "H100 above shows the loss once a step's arithmetic, not its fixed cost, sets its length."))
    for c, v in verdicts.items():
        if v.finding != "higher":
            continue
        # a gain at a low acceptance rate is real when the step split predicts it: tokens per verify step
        # over how much longer the step grew (an upper bound: steps where the lookup found nothing emit one)
        length = round_median([x["mean_accepted_length"] or 1 for x in poor[c]["ngram"]])
        grew = step_s(poor[c]["ngram"]) / step_s(poor[c]["off"])
        predicted = length / grew
        if v.ratio <= predicted * (1 + DEAD_ZONE):
            lines.append(f"The gain at concurrency {c} is no accident: each verify step emitted {length:.2f} "
                         f"tokens while the mean step grew only {grew:.2f}x, which allows up to "
                         f"{predicted:.2f}x; every round measured {v.spread_text()}. A low acceptance rate "
                         "still pays where a wider step costs almost nothing, as on this CPU at this load; "
                         "the H100 model above is where the same rate loses.")
        else:
            lines.append(f"The gain at concurrency {c} ({v.spread_text()}) is more than its {length:.2f} "
                         f"tokens per verify and {grew:.2f}x longer steps allow ({predicted:.2f}x): the "
                         "spec-off rounds likely ran slow for other reasons. Run the cell again before "
                         "trusting it.")
    return "\n".join(lines)
