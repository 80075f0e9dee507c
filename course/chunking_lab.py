"""Chunked prefill measured: decoders run, a long prompt arrives, and the token budget decides who waits.

Notebook 03 runs the experiments; this module holds the arrival run (decoders, then a long
newcomer, on the real engine) and what is read from it: the sentences under each measurement and
the plots. A sentence is chosen from the measured numbers only: the budget sweep names the
trade-off only where the run shows it, and speculation on top of chunking is called faster or
slower only where every interleaved round agrees (``course.noise.compare``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from course import headline
from course.claims import decode_latency
from course.noise import Verdict, round_median
from course.trace import Timeline
from minispec.core.support.metrics import request_metrics
from minispec.tools.summary import StepLog
from minispec.core.request import SamplingParams

# (chunked, speculating) -> the name of that combination, in claims.chunking_and_speculation's order
COMBINATIONS = {(False, False): "neither", (True, False): "chunking", (False, True): "speculation",
                (True, True): "both"}
SWEEP_DEAD_ZONE = 0.05  # two budgets within 5% on an axis are one value on a shared CPU: no rise, no fall


def run_arrival(model, tokenizer, decode_prompts: list, long_prompt: list[int], budget: int,
                chunked: bool = True, spec: str = "off", decode_tokens: int = 40,
                arrive_after_steps: int = 6):
    """One arrival run: the decoders decode, and after ``arrive_after_steps`` steps the long prompt arrives.

    Args:
        model, tokenizer: the target the engine runs (``build_engine``'s).
        decode_prompts: one prompt per decoder (chat messages or token ids); each decodes
            ``decode_tokens`` tokens greedily, EOS ignored.
        long_prompt: the newcomer's token ids (it generates 8 tokens).
        budget: the token budget (``max_num_batched_tokens``) when ``chunked``; without chunking
            a step may carry 4096 tokens, so the whole prompt is prefilled in one step.
        spec: ``SpecConfig.method`` ("off", "ngram", ...).
    Returns:
        the engine, its results in ``engine.result``: "budget" (the int, or "no chunking"), the
        decoders' "itl_p99_s", "itl_max_s" and "tpot_p50_s" (p50 of their TPOTs), the newcomer's
        "newcomer_ttft_s" (all seconds), the decoders' "acceptance_rate" (None without drafts),
        "itl_series" (every step's duration, seconds) and "timeline" (``Timeline.steps``).
    """
    sched = SchedulerConfig(max_num_batched_tokens=budget if chunked else 4096,
                            enable_chunked_prefill=chunked)
    engine = build_engine(EngineConfig(max_model_len=4096, scheduler=sched, spec=SpecConfig(method=spec)),
                          model=model, tokenizer=tokenizer)
    log = engine.add_observer(StepLog())
    timeline = engine.add_observer(Timeline())
    params = SamplingParams(max_tokens=decode_tokens, temperature=0, ignore_eos=True)
    decoders = [engine.add_request(p, params) for p in decode_prompts]
    for _ in range(arrive_after_steps):
        engine.step()
    newcomer = engine.add_request(long_prompt, SamplingParams(max_tokens=8, temperature=0))
    engine.run_until_done()
    proposed = sum(engine.requests[d].num_draft_proposed for d in decoders)
    accepted = sum(engine.requests[d].num_draft_accepted for d in decoders)
    engine.result = {"budget": budget if chunked else "no chunking",
                     **decode_latency([engine.requests[d] for d in decoders]),
                     "newcomer_ttft_s": request_metrics(engine.requests[newcomer])["ttft_s"],
                     "acceptance_rate": accepted / proposed if proposed else None,
                     "itl_series": [s.duration_s for s in log.stats], "timeline": timeline.steps}
    return engine


def arrival_lines(unchunked: dict, chunked: dict, prompt_tokens: int) -> list[str]:
    """The lines under the first two arrival runs: each run's ITL and TTFT, then the longest step.

    Args:
        unchunked, chunked: ``run_arrival`` results without and with chunking.
        prompt_tokens: the long prompt's length in tokens.
    Returns: the lines to print (times in ms and s).
    """
    lines = [f"{str(r['budget']):>12}: decoders' p99 ITL {r['itl_p99_s'] * 1000:7.0f} ms, "
             f"max ITL {r['itl_max_s'] * 1000:7.0f} ms, newcomer TTFT {r['newcomer_ttft_s']:.2f} s"
             for r in (unchunked, chunked)]
    series = unchunked["itl_series"]
    typical_ms = round_median(series) * 1000
    lines.append(f"Without chunking, the step that carried the {prompt_tokens}-token prompt took "
                 f"{max(series) * 1000:.0f} ms, {max(series) * 1000 / typical_ms:.0f}x the median step "
                 f"({typical_ms:.0f} ms); with budget {chunked['budget']} the longest step took "
                 f"{max(chunked['itl_series']) * 1000:.0f} ms.")
    return lines


def _sweep_points(runs: dict, budgets: list[int]) -> tuple[list[float], list[float]]:
    """Per budget, the newcomer's TTFT (s) and the decoders' p99 ITL (ms)."""
    return ([runs[b]["newcomer_ttft_s"] for b in budgets], [runs[b]["itl_p99_s"] * 1000 for b in budgets])


def plot_budget_sweep(runs: dict, budgets: list[int]):
    """The newcomer's TTFT (s) against the decoders' p99 ITL (ms), one point per budget. Returns the axes.

    Args:
        runs: budget -> ``run_arrival`` result; budgets: the points to draw, smallest first.
    """
    xs, ys = _sweep_points(runs, budgets)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(xs, ys, marker="o")
    for b, x, y in zip(budgets, xs, ys):
        ax.annotate(str(b), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set(xlabel="newcomer's TTFT (s)", ylabel="decoders' p99 ITL (ms)",
           title=headline(f"Budget {budgets[0]} -> {budgets[-1]}: TTFT {xs[0]:.2f} -> {xs[-1]:.2f} s, "
                          f"p99 ITL {ys[0]:.0f} -> {ys[-1]:.0f} ms"))
    ax.grid(alpha=0.3)
    return ax


def _worse_on_both(xs: list[float], ys: list[float], budgets: list[int]) -> list[tuple[int, int]]:
    """(b, c) for each budget b that some budget c beat on both axes, each by more than the dead zone."""
    band = 1 + SWEEP_DEAD_ZONE
    out = []
    for i, b in enumerate(budgets):
        c = next((budgets[j] for j in range(len(budgets)) if xs[i] > xs[j] * band and ys[i] > ys[j] * band),
                 None)
        if c is not None:
            out.append((b, c))
    return out


def _ttft_line(xs: list[float], budgets: list[int]) -> str:
    """The TTFT end of the sweep: a rise or a fall named only beyond the dead zone."""
    dz, best = SWEEP_DEAD_ZONE, min(xs)
    fastest = budgets[xs.index(best)]
    near = [b for b, x in zip(budgets, xs) if x <= best * (1 + dz)]  # as fast as the fastest, within 5%
    steady = all(b <= a * (1 + dz) for a, b in zip(xs, xs[1:]))  # no TTFT rose beyond the noise
    if xs[-1] > best * (1 + dz):
        return (f"The newcomer's TTFT was lowest at a budget of {fastest} ({best:.2f} s) and rose again "
                f"above it ({xs[-1]:.2f} s at {budgets[-1]}, more than {dz:.0%} higher): on a CPU one very "
                "long step costs more than its chunks (its attention grows with the square of the chunk), so "
                "past a point a larger budget no longer buys TTFT.")
    if steady and near == [budgets[-1]]:
        return (f"The newcomer's TTFT fell as the budget grew ({xs[0]:.2f} -> {xs[-1]:.2f} s): the "
                "trade-off the section describes.")
    if steady:
        return (f"The newcomer's TTFT fell as the budget grew ({xs[0]:.2f} -> {xs[-1]:.2f} s) until "
                f"{near[0]}; from there every budget came within {dz:.0%} of the lowest ({best:.2f} s at "
                f"{fastest}), so a larger one bought no TTFT this run can measure.")
    return (f"The newcomer's TTFT was lowest at a budget of {fastest} ({best:.2f} s), and {budgets[-1]} came "
            f"within {dz:.0%} of it ({xs[-1]:.2f} s): no rise at the top that this run can tell from noise.")


def budget_sweep_lines(runs: dict, budgets: list[int]) -> list[str]:
    """Whether the budget sweep showed the trade-off, stated only as far as its numbers go.

    A TTFT "rose" or "fell" only by more than ``SWEEP_DEAD_ZONE`` (5%); the trade-off holds between two
    neighbouring budgets only where the smaller one gave the lower p99 ITL and the longer TTFT; a budget
    that another beat on both axes is named as noise, since no trade-off explains it.

    Args:
        runs: budget -> ``run_arrival`` result; budgets: the budgets swept, smallest first.
    Returns: three lines to print: the ITL end of the trade-off, the TTFT end, then how far the
        trade-off held (or which points no trade-off explains).
    """
    xs, ys = _sweep_points(runs, budgets)
    dz = SWEEP_DEAD_ZONE
    if ys[0] * (1 + dz) < ys[-1]:
        itl = (f"The budget of {budgets[0]} kept the decoders' p99 ITL {ys[-1] / ys[0]:.1f}x lower than "
               f"{budgets[-1]} did.")
    else:
        itl = ("The smallest budget did not give a clearly lower p99 ITL than the largest in this run: step "
               "times are noisy when other work shares the CPU; run the cell again.")
    lines = [itl, _ttft_line(xs, budgets)]
    worse = _worse_on_both(xs, ys, budgets)
    if worse:
        at = {b: i for i, b in enumerate(budgets)}
        pairs = "; ".join(f"budget {b} did worse than {c} on both axes (TTFT {xs[at[b]]:.2f} against "
                          f"{xs[at[c]]:.2f} s, p99 ITL {ys[at[b]]:.0f} against {ys[at[c]]:.0f} ms)"
                          for b, c in worse)
        return lines + [f"Not every point fits a trade-off: {pairs}. No budget setting explains a point "
                        "worse on both axes, so it is this run's noise (other programs, or a run made at "
                        "another moment); run the cell again before reading the curve there."]
    best = min(xs)
    top = next(b for b, x in zip(budgets, xs) if x <= best * (1 + dz))  # the smallest budget as fast as any
    upto = [i for i, b in enumerate(budgets) if b <= top]
    if len(upto) < 2:
        return lines + [f"The smallest budget, {budgets[0]}, was already within {dz:.0%} of the lowest "
                        "TTFT: this sweep shows no trade-off to read."]
    broken = [f"{budgets[i]} and {budgets[i + 1]}" for i in upto[:-1]
              if not (ys[i] < ys[i + 1] and xs[i] > xs[i + 1])]
    if broken:
        return lines + [f"Up to {top} the trade-off did not hold at every step: between {', '.join(broken)} "
                        "the smaller budget did not give both the lower ITL and the longer TTFT."]
    return lines + [f"Up to {top} every smaller budget gave a lower p99 ITL and a longer TTFT: the trade-off "
                    "held at each step."]


def speculation_on_chunking_lines(ngram_runs: list[dict], tpots: dict, verdict: Verdict, k: int) -> list[str]:
    """The lines under chunking with n-gram speculation against chunking alone, over interleaved rounds.

    Args:
        ngram_runs: the speculative rounds' ``run_arrival`` results, in round order.
        tpots: {"off": [...], "ngram": [...]}: the decoders' p50 TPOT per round (seconds).
        verdict: ``noise.compare`` of the decoders' speed (1 / TPOT), n-gram over off.
        k: draft tokens per verify step (``num_speculative_tokens``).
    Returns: the lines to print: the last round's steps, the median TPOTs, the headline, its reading.
    """
    r = ngram_runs[-1]
    verify_steps = sum(1 for step in r["timeline"] if any(kind == "verify" for _, kind, _ in step))
    mixed = sum(1 for step in r["timeline"] if {"verify", "prefill"} <= {kind for _, kind, _ in step})
    rates = [x["acceptance_rate"] for x in ngram_runs if x["acceptance_rate"] is not None]
    rate = round_median(rates) if rates else None
    acceptance = "no drafts proposed" if rate is None else f"acceptance rate {rate:.2f}"
    speed = headline("Speculation on top of chunking, decoders' speed: " + verdict.text("faster", "slower"))
    return [f"chunked + n-gram (last round): p99 ITL {r['itl_p99_s'] * 1000:.0f} ms, newcomer TTFT "
            f"{r['newcomer_ttft_s']:.2f} s, {verify_steps} steps with verify positions, {mixed} of them "
            "also carrying a prompt chunk",
            f"decoders' p50 TPOT, median of {len(tpots['ngram'])} rounds: "
            f"{round_median(tpots['ngram']) * 1000:.0f} ms with n-gram speculation ({acceptance}), "
            f"{round_median(tpots['off']) * 1000:.0f} ms without.",
            speed + ".", _speculation_reading(rate, verdict, k)]


def _speculation_reading(rate: float | None, verdict: Verdict, k: int) -> str:
    """What the verdict on speculation over chunking means, given the median acceptance rate."""
    if rate is None:
        return ("n-gram found no repeated text to draft from, so every step was a plain decode: any "
                "difference is noise.")
    if verdict.finding == "noisy":
        return ("The rounds disagreed on the direction, so this run cannot say whether speculation helped: "
                "other programs shared the CPU during some rounds, or the effect is smaller than the "
                "machine's wobble.")
    if verdict.finding == "higher" and rate < 0.2:
        return (f"Every round agreed, but read it with care: at an acceptance rate of {rate:.2f} a verify "
                f"step emits at most about 1 + {rate:.2f} x {k} = {1 + rate * k:.2f} tokens, so a "
                f"{verdict.ratio:.2f}x gain needs a verify step to cost only "
                f"{(1 + rate * k) / verdict.ratio:.2f} plain steps. That can hold while the decoders' steps "
                "are bound by the engine's fixed per-step work, but it is a thin margin: a little noise on "
                "the spec-off rounds makes the same ratio. Notebook 04 measures when speculation pays.")
    if verdict.finding == "higher":
        return ("Speculation sped up the decoders on top of chunking in every round "
                f"({verdict.spread_text()}).")
    if verdict.finding == "tie":
        return (f"About the same TPOT: at an acceptance rate of {rate:.2f} the accepted drafts barely paid "
                "for the verify positions. Notebook 04 measures when speculation pays.")
    return (f"Here speculation slowed the decoders down: at an acceptance rate of {rate:.2f} the accepted "
            "drafts did not pay for the verify positions, which on a CPU cost real time (notebook 01). "
            "Notebook 04 measures when speculation pays.")


def worst_gap_text(grid: dict, exact: bool) -> str:
    """Which combination left the decoders the smallest worst gap, or that one run cannot rank the two best.

    Args:
        grid: ``claims.chunking_and_speculation``'s result.
        exact: True for the simulator's virtual clock, which ranks any gap; a measured run needs
            the runner-up's worst gap more than 10% larger.
    """
    first, second = sorted(COMBINATIONS, key=lambda key: grid[key]["itl_max_s"])[:2]
    gap = grid[second]["itl_max_s"] / grid[first]["itl_max_s"] - 1
    if exact or gap > 0.10:
        return f"smallest worst gap: {COMBINATIONS[first]}"
    return f"{COMBINATIONS[first]} and {COMBINATIONS[second]} within {gap:.1%}: one run cannot rank them"


def plot_combinations(panels: list[tuple[str, dict, bool]]):
    """One panel per grid: the decoders' p50 TPOT and worst ITL (ms, log scale) in the four combinations.

    Args:
        panels: (where, grid, exact) per panel, at least two: ``grid`` is
            ``claims.chunking_and_speculation``'s result, ``exact`` as in :func:`worst_gap_text`.
    Returns: the figure, laid out (show it with ``plt.show()``).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 3.8))  # 9 in: a notebook's width at 100%
    keys = list(COMBINATIONS)
    x = range(len(keys))
    for ax, (where, grid, exact) in zip(axes, panels):
        ax.bar([i - 0.2 for i in x], [1000 * grid[key]["tpot_p50_s"] for key in keys], 0.4,
               label="decoders' p50 TPOT")
        ax.bar([i + 0.2 for i in x], [1000 * grid[key]["itl_max_s"] for key in keys], 0.4,
               label="decoders' worst ITL")
        ax.set_xticks(list(x), [COMBINATIONS[key] for key in keys])
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 20, 50, 100, 200, 500 ms
        ax.yaxis.set_major_formatter(ScalarFormatter())  # 100 and 200, not 10^2 and 2 x 10^2
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("ms")
        ax.set_title(headline(f"{where}\n{worst_gap_text(grid, exact)}"), fontsize=9)
    # one legend for both panels, under them: inside a panel it covered the tallest bar
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def combination_lines(grids: list[tuple[str, dict]]) -> list[str]:
    """Per grid, what chunking did to the worst gap and speculation to TPOT, and a note where both grew it.

    Args:
        grids: (where, ``claims.chunking_and_speculation`` result) pairs.
    Returns: the lines to print (ms).
    """
    lines = []
    for where, grid in grids:
        n, c, s, b = (grid[key] for key in COMBINATIONS)
        lines.append(f"{where}: chunking cut the worst decoder gap {n['itl_max_s'] / c['itl_max_s']:.1f}x "
                     f"({1000 * n['itl_max_s']:.0f} -> {1000 * c['itl_max_s']:.0f} ms); speculation took p50 "
                     f"TPOT from {1000 * n['tpot_p50_s']:.1f} to {1000 * s['tpot_p50_s']:.1f} ms; both "
                     f"together: TPOT {1000 * b['tpot_p50_s']:.1f} ms, worst gap "
                     f"{1000 * b['itl_max_s']:.0f} ms.")
        if b["itl_max_s"] > 1.5 * c["itl_max_s"]:
            lines.append("  With speculation the worst gap under chunking grew: the draft catches up on the "
                         "long prompt in one step when it starts decoding (minispec chunks the target's "
                         "prefill, not the draft's catch-up).")
    return lines
