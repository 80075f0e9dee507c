"""Notebook 06's reports: what speculation costs, measured on the live engine and simulated.

Each ``report_*`` function plots and prints one experiment of
notebooks/06_what_speculation_costs.ipynb (the draft's share of a verify step, the neighbours' step
split, quantization's effect on the crossover, a tree against a chain), the words chosen by the
numbers of the run beside it. The live arms they report come from course.live_arms.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from course import headline
from course.live_arms import CONCURRENCY_TICKS, LiveArms, cached_curve
from course.noise import compare
from course.plots import below_one_text, speedup_axes


def report_draft_cost(live: LiveArms, chain: str, tree: str) -> None:
    """The draft's share of each verify step for two live arms at the lowest load, and the tree
    against the chain round by round (a ranking only when the compare rule settles it)."""
    c = live.concurrency[0]
    for name in (chain, tree):
        print(headline(f"Here, shipped draft, {name.split(': ')[1]}, concurrency {c}: the draft's forwards "
                       f"took {live.pooled(name, c, 'draft_time_share'):.2f} of the target's time per verify "
                       f"step; mean accepted length {live.pooled(name, c, 'mean_accepted_length'):.2f}: "
                       f"{live.verdict[(name, c)].text()}{live.caveat(name, c)}."))
    tree_vs_chain = compare(live.tok_s[c][tree], live.tok_s[c][chain])  # the two arms' own rounds, paired
    if tree_vs_chain.finding in ("lower", "probably lower"):
        print("The tree emitted more tokens per verify than the chain "
              f"({live.pooled(tree, c, 'mean_accepted_length'):.2f} against "
              f"{live.pooled(chain, c, 'mean_accepted_length'):.2f}) and still gained less: its extra draft "
              "forwards and verify rows are arithmetic, which a CPU pays for row by row. Expect the gap to "
              "widen on a busy machine: in the course's reference runs (bench/results/course_headlines.json) "
              "the tree's gain at c=1 shrank to no measurable difference with one core kept busy, while the "
              "chain's held.")
    else:
        print("Tree against chain, round by round: "
              f"{tree_vs_chain.text('the tree ahead', 'the tree behind')}. The rounds do not put the tree "
              "below the chain on this run, so this run does not say which gains more here.")


def report_neighbours(places: tuple) -> None:
    """Fat verify steps slow the neighbours: for each (where, ``claims.neighbours`` result), the bulk
    lane's p50 TPOT with speculating neighbours against the all-plain run, and which part of the step
    (the draft's forwards, the wider verify, the rest) made its steps longer."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 7.5))  # stacked: readable at a notebook's width
    labels, bars = [], []
    for where, r in places:
        for lane in ("bulk", "interactive"):
            for run in ("plain", "speculating"):
                # one line a bar: the titles say which drafter
                labels.append(f"{where.split(' (')[0]}: {lane}, {run}")
                bars.append(r[run][lane]["tpot_p50_s"] / r["plain"][lane]["tpot_p50_s"])
    ax.barh(labels, bars, color=["tab:grey", "tab:red", "tab:grey", "tab:green"] * 2)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("p50 TPOT relative to the all-plain run (lower is faster)")
    ratios = {where: r["speculating"]["bulk"]["tpot_p50_s"] / r["plain"]["bulk"]["tpot_p50_s"] for where,
              r in places}
    tpot_line = headline("Bulk lane TPOT with speculating neighbours: "  # printed under the figure
                         + ", ".join(f"{v:.2f}x {w}" for w, v in ratios.items()))
    ax.set_title("The lanes' p50 TPOT beside speculating neighbours", fontsize=10)
    split_labels, left = [], {}
    for where, r in places:
        base = r["plain"]["steps"]["step_s"]
        for run in ("plain", "speculating"):
            split_labels.append(f"{where.split(' (')[0]}: {run}")
            for part in ("target_s", "draft_s", "other_s"):
                left.setdefault(part, []).append(r[run]["steps"][part] / base)
    start = [0.0] * len(split_labels)
    for part, color in (("target_s", "tab:blue"), ("draft_s", "tab:orange"), ("other_s", "tab:grey")):
        bx.barh(split_labels, left[part], left=start, color=color,
                label=part[:-2].replace("target", "target forward (verify)"))
        start = [a + b for a, b in zip(start, left[part])]
    bx.set_xlabel("mean time of the bulk lane's decode steps, over the all-plain step")
    share = {}
    for where, r in places:
        p, s = r["plain"]["steps"], r["speculating"]["steps"]
        share[where] = (s["draft_s"] - p["draft_s"], s["target_s"] - p["target_s"],
                        s["other_s"] - p["other_s"],
                        s["step_s"] - p["step_s"])
    split_line = headline("What the neighbours added per step: " + "; ".join(
        f"{w.split(' (')[0]} draft {d / r['plain']['steps']['step_s']:+.2f}, verify "
        f"{t / r['plain']['steps']['step_s']:+.2f} of a plain step"
        for (w, (d, t, o, a)), (_, r) in zip(share.items(), places)))
    bx.set_title("What the neighbours added to the bulk lane's decode steps", fontsize=10)
    bx.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)  # off the bars
    plt.tight_layout()
    plt.show()
    print(tpot_line + ".\n" + split_line + ".")
    for (where, r), (d, t, o, added) in zip(places, share.values()):
        p = r["plain"]["steps"]["step_s"]
        # + 0.0: -0.04 ms prints 0.0, not -0.0
        ms = [round(1000 * x, 1) + 0.0 for x in (p, p + added, d, t, o)]
        print(f"{where}: the bulk lane's p50 TPOT was {ratios[where]:.2f}x its all-plain value; its steps "
              f"went from {ms[0]:.1f} to {ms[1]:.1f} ms: the draft's forwards added {ms[2]:.1f} ms, the "
              f"target's wider verify {ms[3]:.1f} ms, the rest of the step {ms[4]:.1f} ms.")
        if added < -0.03 * p:
            print("  Faster beside speculating neighbours, which speculation cannot cause (the bulk lane "
                  "never speculates and its neighbours only add work): the machine was busier during the "
                  "plain run; run the cell again.")
        elif added < 0.03 * p:
            print("  No slower: a step with the neighbours' extra rows cost about what a plain step did.")
        else:
            main = max((("the draft's forwards", d), ("the wider verify", t), ("the rest of the step "
                        "(drafting and verify bookkeeping on the CPU)", o)), key=lambda x: x[1])[0]
            print(f"  Most of the slowdown came from {main}: every request in a step waits for it, "
                  "speculating or not.")


def report_quantized_crossover(modelled: dict) -> None:
    """Speculation's simulated speedup against concurrency per weight format (``modelled``: format ->
    sweep rows with "off" and a speculating method), and how much faster the smaller format makes
    spec off at c=1."""
    spec = {fmt: {r["concurrency"]: r["speedup_vs_off"] for r in rows if r["spec"] != "off"}
            for fmt, rows in modelled.items()}
    off = {fmt: {r["concurrency"]: r["throughput_tok_s"] for r in rows if r["spec"] == "off"}
           for fmt, rows in modelled.items()}
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name, pts in spec.items():
        ax.plot(list(pts), list(pts.values()), marker="o", label=f"{name} weights")
    speedup_axes(ax, "speculation's speedup over spec off")
    (wide, a), (narrow, b) = list(spec.items())[:2]
    top = max(a)
    ax.set_title(headline(f"H100 model, 1B draft, alpha 0.8: speculation {a[1]:.2f}x -> {b[1]:.2f}x at c=1 "
                          f"and {a[top]:.2f}x -> {b[top]:.2f}x at c={top} going from {wide} to {narrow} "
                          "weights"),
                 fontsize=9, wrap=True)
    ax.legend(fontsize=8)
    plt.tight_layout()
    plt.show()
    print(f"{narrow} makes spec off {off[narrow][1] / off[wide][1]:.2f}x faster at c=1: fewer bytes per "
          "decode step, so less of a memory-bound step for speculation to save.")


def report_tree_vs_chain(live: LiveArms, shapes: dict, tree_rows: list[dict], tree_where: str | None,
                         gpu_speedup: dict, gpu_length: dict, grid: list[int]) -> None:
    """A tree against a chain on two clocks: the live arms' speedups at two loads beside the cached
    sweep (left), the simulated H100's (right), then the verdicts, ranked only where the rounds
    do not overlap. ``shapes``: live arm -> (method, k, nodes); ``gpu_speedup``: simulated arm ->
    {c: speedup}; ``gpu_length``: simulated arm -> mean accepted length at c=1."""
    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 8))  # stacked: readable at a notebook's width
    for (name, key), color in zip(shapes.items(), ("tab:orange", "tab:green")):
        short = name.split(": ")[1]
        live.errorbar(a, name, color, f"{short}, measured here")
        pts = cached_curve(tree_rows, "chat", *key)
        if pts:
            a.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", marker=".", color=color, alpha=0.6,
                   label=f"{short}, {tree_where}")
    speedup_axes(a, "tokens/s over spec off (chat prompts)", CONCURRENCY_TICKS)
    here_line = headline("Here: " + "; ".join(f"{n.split(': ')[1]} c={c} {live.verdict[(n, c)].text()}"
                                              for n in shapes for c in live.concurrency))
    a.set_title("Here: measured (rounds' range) and the cached sweep", fontsize=10)
    a.legend(fontsize=8)
    for name, s in gpu_speedup.items():
        b.plot(grid, [s[c] for c in grid], marker="o", label=f"{name} (mean accepted length "
                                                             f"{gpu_length[name]:.2f})")
    speedup_axes(b, "throughput over spec off", grid)
    gpu_line = headline("Simulated H100, 8B target, 1B draft, alpha 0.8: " + "; ".join(
        f"{n} {s[1]:.2f}x at c=1, " + below_one_text(grid, [s[c] for c in grid])
        for n, s in gpu_speedup.items()))
    b.set_title("Simulated H100, 8B target, 1B draft, alpha 0.8", fontsize=10)
    b.legend(fontsize=8)
    plt.tight_layout()
    plt.show()
    print(here_line + ".\n" + gpu_line + ".")
    chain, tree = list(shapes)
    lo, hi = live.concurrency[0], live.concurrency[-1]
    print(f"Here at c={lo}: the tree emitted {live.pooled(tree, lo, 'mean_accepted_length'):.2f} tokens per "
          f"verify against the chain's {live.pooled(chain, lo, 'mean_accepted_length'):.2f}; the tree was "
          f"{live.verdict[(tree, lo)].text()}{live.caveat(tree, lo)}, the chain "
          f"{live.verdict[(chain, lo)].text()}.")
    tv, cv = live.verdict[(tree, hi)], live.verdict[(chain, hi)]
    print(headline(f"At c={hi} the tree measured {tv.ratio:.2f}x and the chain {cv.ratio:.2f}x: "
                   + ("the tree fell behind the chain, as its extra rows predict." if tv.high < cv.low else
                      "the rounds overlap, too noisy to rank them on this run." if tv.ratio < cv.ratio else
                      "the tree kept up with the chain on this run, against the rows argument: a load this "
                      "small may still leave spare compute on your machine, or noise decided it; the cached "
                      "curve goes further.")))
    if tree_rows:
        t = {r["concurrency"]: r["speedup_vs_off"] for r in tree_rows
             if r["spec"] == "draft" and (r.get("num_draft_tokens") or 0) > r["k"]}
        ch = {r["concurrency"]: r["speedup_vs_off"] for r in tree_rows
              if r["spec"] == "draft" and (r.get("num_draft_tokens") or r["k"]) == r["k"]}
        first = lambda d: next((c for c in sorted(d) if d[c] < 1), "never")
        print(headline(f"Cached ({tree_where}): tree {t[min(t)]:.2f}x at c={min(t)} -> {t[max(t)]:.2f}x at "
                       f"c={max(t)}, chain {ch[min(ch)]:.2f}x -> {ch[max(ch)]:.2f}x; the tree below 1.0 from "
                       f"c={first(t)}, the chain from c={first(ch)}."))
