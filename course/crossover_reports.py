"""Notebook 05's reports: the crossover where the messenger loses to the truck, measured and simulated.

Each ``report_*`` function plots and prints one experiment of notebooks/05_messenger_vs_truck.ipynb
(the live and simulated crossover, per-user speed against the fleet, the committed GPU run beside
the fitted simulator), so each sentence a learner reads is computed from the run beside it;
``crossover_explorer`` is the notebook's explorer, and ``gpu_thresholds`` places notebook 07's
``threshold:N`` on the same GPU run. The arms they report come from course.live_arms.
"""

from __future__ import annotations

import functools
import statistics

import ipywidgets as w
import matplotlib.pyplot as plt

from course import headline, interact
from course.exercises import reference_threshold
from course.gpu import crossover_rows, plot_crossover
from course.live_arms import CONCURRENCY_TICKS, LiveArms, cached_curve, verdict_notes
from course.plots import below_one_text, speedup_axes
from course.published import hardware_with_overhead
from minispec.sim import available_hardware, load_hardware, load_model_spec, sweep
from minispec.sim.published import TARGETS


def report_live_crossover(live: LiveArms, cached: dict, xover: list[dict], where: str | None) -> None:
    """Notebook 05's first chart: each live arm's speedup at two loads beside the cached sweep
    (``cached``: live arm name or label -> (prompts, method, k) of the sweep), then the verdicts and
    the cached curves' c=32 points against the source notes' example (2x -> 1.1x or 0.9x)."""
    lo, hi = live.concurrency[0], live.concurrency[-1]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, key), color in zip(cached.items(), ("tab:blue", "tab:orange")):
        if name in live.base:
            live.errorbar(ax, name, color, f"{name}, measured here ({live.rounds} rounds)")
        pts = cached_curve(xover, *key)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", marker=".", color=color, alpha=0.6,
                    label=f"{name}, {where}")
    speedup_axes(ax, "tokens/s over spec off (same prompts, same concurrency)", CONCURRENCY_TICKS)
    ax.set_title(headline("Here: " + "; ".join(f"{name} at c={c} {live.verdict[(name, c)].text()}"
                                               for name in live.base for c in (lo, hi))), fontsize=8,
                 wrap=True)
    ax.legend(fontsize=7)
    plt.tight_layout()
    plt.show()
    for name in live.base:
        v0, v1 = live.verdict[(name, lo)], live.verdict[(name, hi)]
        print(headline(f"{name}: c={lo} {v0.text()}{live.caveat(name, lo)}; c={hi} "
                       f"{v1.text()}{live.caveat(name, hi)}."))
        for line in verdict_notes(live, name):
            print(line)
    for label, key in cached.items():
        pts = cached_curve(xover, *key)
        if pts and pts[-1][0] >= 32:
            (c0, s0, *_), (c1, s1, low, high) = pts[0], pts[-1]
            seed = ("the source notes' example" if s0 >= 1.7 and 0.85 <= s1 <= 1.15
                    else "a different curve from the notes' example")
            print(headline(f"Concurrency 32 on this kind of machine ({where}): {label} {s0:.2f}x at c={c0} "
                           f"-> {s1:.2f}x at c={c1} (rounds {low:.2f}-{high:.2f}): {seed} (2x -> 1.1x or "
                           "0.9x)."))


def report_sim_crossover(speedup: dict, first_below: dict, grid: list[int]) -> None:
    """The simulated crossover, computed in notebook 05 (``speedup``: (hardware, alpha) -> {c: speedup};
    ``first_below``: (hardware, alpha) -> the first load of ``grid`` below 1.0, or None), plotted and
    set against the source notes' example."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (hw, alpha), s in speedup.items():
        ax.plot(grid, [s[c] for c in grid], marker="o", ls="-" if alpha == 0.8 else "--",
                label=f"{hw}, alpha {alpha}")
    speedup_axes(ax, "throughput speedup (draft k=4 over spec off)")
    good, poor = speedup[("h100", 0.8)], speedup[("h100", 0.3)]
    ax.set_title(f"Simulated H100, draft k=4: alpha 0.8 {good[1]:.2f}x at c=1, {good[32]:.2f}x at c=32; "
                 f"alpha 0.3 {poor[1]:.2f}x at c=1, {poor[32]:.2f}x at c=32", fontsize=9)
    ax.legend()
    plt.show()
    for (hw, alpha), s in speedup.items():
        below = first_below[(hw, alpha)]
        print(f"{hw} alpha {alpha}: {s[1]:.2f}x at c=1, {s[32]:.2f}x at c=32, {s[128]:.2f}x at c=128; "
              + (f"below 1.0 from c={below}." if below else "never below 1.0 up to c=128."))
    good = [s for (hw, alpha), s in speedup.items() if alpha == 0.8]
    shrinks = all(s[32] < s[1] for s in good)
    print("Against the source notes' example (about 2x at c=1, 1.1x or 0.9x at c=32): the alpha-0.8 draft "
          f"{'loses ground' if shrinks else 'does not lose ground'} between c=1 and c=32 on both devices, "
          f"from {min(s[1] for s in good):.2f}-{max(s[1] for s in good):.2f}x to "
          f"{min(s[32] for s in good):.2f}-{max(s[32] for s in good):.2f}x.")


RATIO_KEYS = ("tpot_p50_s", "tpot_mean_s", "ttft_mean_s", "e2e_mean_s", "throughput_tok_s")


def report_user_vs_fleet(by: dict, grid: list[int], max_tokens: int) -> None:
    """Per-user speed against fleet throughput from two closed-loop sweeps (``by``: "off" and
    "draft" -> {c: summary}): the chart, a table of the draft's ratios to spec off per concurrency,
    and why the fleet follows the mean E2E at the load where spec off peaks."""
    user = {m: max(1 / r["tpot_p50_s"] for r in rs.values()) for m, rs in by.items()}  # fastest a user got
    fleet = {m: max(r["throughput_tok_s"] for r in rs.values()) for m, rs in by.items()}  # most the fleet got
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, marker in (("off", "o"), ("draft", "s")):
        rs = [by[method][c] for c in grid]
        ax.plot([r["throughput_tok_s"] for r in rs], [1 / r["tpot_p50_s"] for r in rs], marker=marker,
                label=method)
        for c, r in zip(grid, rs):
            ax.annotate(str(c), (r["throughput_tok_s"], 1 / r["tpot_p50_s"]), fontsize=7,
                        textcoords="offset points",
                        xytext=(3, 3))
    ax.set(xlabel="fleet throughput (tokens/s)", ylabel="per-user tokens/s (1 / p50 TPOT)")
    ax.set_title(headline(f"Simulated H100, alpha 0.8: fastest user {user['draft'] / user['off']:.2f}x with "
                          f"the draft, most fleet output {fleet['draft'] / fleet['off']:.2f}x"), fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    plt.show()
    faster = [c for c in grid if by["draft"][c]["tpot_p50_s"] < by["off"][c]["tpot_p50_s"]]
    print("The draft lowered the p50 TPOT at concurrency "
          + (", ".join(map(str, faster)) if faster else "none")
          + f" of {grid[0]}-{grid[-1]}.")
    print("draft over spec off, per concurrency:   p50 TPOT  mean TPOT  mean TTFT  mean E2E  fleet tok/s")
    for c in grid:
        d, o = by["draft"][c], by["off"][c]
        widths = (8, 9, 9, 8, 10)
        print(f"  c={c:<4} {'':24s}" + " ".join(f"{d[key] / o[key]:{wd}.2f}x" for key,
                                                wd in zip(RATIO_KEYS, widths)))
    c_top = max(grid, key=lambda c: by["off"][c]["throughput_tok_s"])  # where spec off's fleet output peaks
    d, o = by["draft"][c_top], by["off"][c_top]
    # each slot emits its tokens per E2E
    pred = {m: c_top * max_tokens / by[m][c_top]["e2e_mean_s"] for m in by}
    r = {key: d[key] / o[key] for key in RATIO_KEYS}
    print(headline(f"At c={c_top}, where spec off peaks: with the draft the p50 TPOT is "
                   f"{r['tpot_p50_s']:.2f}x spec off's, the mean TPOT {r['tpot_mean_s']:.2f}x, the mean TTFT "
                   f"{r['ttft_mean_s']:.2f}x, the mean E2E {r['e2e_mean_s']:.2f}x and the fleet's output "
                   f"{r['throughput_tok_s']:.2f}x."))
    print("  In a closed loop every slot holds one request from arrival to last token, so the fleet's rate "
          f"is about slots x tokens / mean E2E: {pred['off']:.0f} tok/s predicted against "
          f"{o['throughput_tok_s']:.0f} measured for spec off, {pred['draft']:.0f} against "
          f"{d['throughput_tok_s']:.0f} with the draft (the rest is the tail, when the last requests run in "
          "a part-empty batch). The fleet follows the mean E2E, not the median TPOT: the median is one "
          "request's view of its decode steps alone, and it leaves out the prefill wait (TTFT) and the "
          "slower half.")
    if r["ttft_mean_s"] > 1.05:
        print(f"  The TTFT grew {r['ttft_mean_s']:.2f}x: the draft prefills every prompt into its own KV "
              "cache too, so each step that admits new requests runs longer, and a request that arrives "
              "waits for it.")
    if r["tpot_p50_s"] < 1 and r["throughput_tok_s"] < 1:
        print(f"  So the draft can lower the median user's TPOT ({r['tpot_p50_s']:.2f}x) while the fleet "
              f"emits less ({r['throughput_tok_s']:.2f}x): both numbers are right; they measure different "
              "things.")


def losing_from(rows: list[dict], arm: str, key: str = "speedup") -> int | None:
    """The first concurrency from which every point of ``arm`` stays below 1.0 (None: no such point)."""
    mine = [r for r in rows if r["arm"] == arm]
    return next((r["concurrency"] for i, r in enumerate(mine) if all(x[key] < 1.0 for x in mine[i:])), None)


def arm_miss_line(mine: list[dict]) -> str | None:
    """Where the simulator misses one arm of a GPU run (its median speedup error above the course's
    target for speedups), a sentence that says so and names the measured points that rise with the
    load by more than 10%, a sign of a noisy wave (one per point), which leaves the model's share of the
    miss unknown. None where the arm meets the target.

    Args:
        mine: ``crossover_rows`` of one arm, in concurrency order.
    """
    errs = [abs(r["error"]) for r in mine if r.get("error") is not None and not r["fitted"]]
    target = TARGETS["speedup"]["median"]
    if not errs or statistics.median(errs) <= target:
        return None
    rises = [f"c={a['concurrency']} -> {b['concurrency']}: {a['speedup']:.2f}x -> {b['speedup']:.2f}x"
             for a, b in zip(mine, mine[1:]) if b["speedup"] > 1.1 * a["speedup"]]
    line = (f"The simulator misses this arm: median error {statistics.median(errs):.0%}, above the "
            f"{target:.0%} target for speedups")
    if not rises:
        return line + "; its measured points fall steadily with the load, so the miss is the model's."
    return (line + f". Its measured speedup also rises with the load ({'; '.join(rises)}), which is what a "
            "noisy single wave looks like (one wave per point, no repeats), so this run cannot say how much "
            "of the miss is the model's.")


def report_gpu_crossover(gpu: dict) -> None:
    """The committed GPU run's crossover beside the fitted simulator: the chart, each arm's trend
    (a dip below 1.0 with a later point above settles no crossover), the c=32 points, the 1B draft's
    forward against the target's, and the host costs the fit found."""
    rows = crossover_rows(gpu)
    fig, ax = plt.subplots(figsize=(9, 4.2))
    plot_crossover(ax, gpu)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    ax.set_title(headline(f"{gpu['device']['name']}, {gpu['date']}, minispec with CUDA graphs: " + "; ".join(
        f"{arm} {next(r['speedup'] for r in rows if r['arm'] == arm):.2f}x at c=1" for arm in arms)),
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, off the points
    ax.grid(alpha=0.3)
    plt.tight_layout()
    plt.show()
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        errs = [abs(r["error"]) for r in mine if r.get("error") is not None and not r["fitted"]]
        loss, sim_loss = losing_from(rows, arm), losing_from(rows, arm, "simulated_speedup")
        dips = [r for r in mine if r["speedup"] < 1.0 and (loss is None or r["concurrency"] < loss)]
        print(f"{arm:16s}: {mine[0]['speedup']:.2f}x at c=1 -> {mine[-1]['speedup']:.2f}x at "
              f"c={mine[-1]['concurrency']}; " + (f"below 1.0 from c={loss} on" if loss
                                                  else "not below 1.0 to the end")
              + " (simulated: " + (f"from c={sim_loss}" if sim_loss else "never") + "); simulator's error "
              f"median {statistics.median(errs):.0%}, worst {max(errs):.0%}"
              + (" (one point fitted, left out)" if any(r["fitted"] for r in mine) else ""))
        if dips:
            dipped = ", ".join(f"{r['speedup']:.2f}x at c={r['concurrency']}" for r in dips)
            print(f"{'':18s}{dipped} dipped below 1.0 with a later point above it: each point is one wave, "
                  "so this run settles no crossover for this arm.")
        miss = arm_miss_line(mine)
        if miss:
            print(f"{'':18s}{miss}")
    at32 = {arm: next((r["speedup"] for r in rows if r["arm"] == arm and r["concurrency"] == 32), None)
            for arm in arms}
    print(headline("At c=32, where the notes' 2x demo becomes 1.1x or 0.9x: " + ", ".join(
        f"{arm} {x:.2f}x" for arm, x in at32.items() if x is not None) + " (one wave each)"))
    errs = [abs(r["error"]) for r in rows if r.get("error") is not None and not r["fitted"]]
    print(f"Over all {len(errs)} predicted points: median error {statistics.median(errs):.0%}, worst "
          f"{max(errs):.0%} (single waves on the device, no repeats: a point far from both neighbours is "
          "more likely noise than model)")
    one = {name: next(r for r in s["rows"] if r["mode"] == "graphs" and r["tokens"] == 1)
           for name, s in gpu["steps"].items()}
    d, target = one["llama-3.2-1b"], one["llama-3-8b"]
    print(f"One forward of the 1B draft takes {d['step_ms']:.2f} ms with CUDA graphs, "
          f"{d['step_ms'] / d['roofline_ms']:.1f}x its roofline ({d['roofline_ms']:.2f} ms); the 8B target's "
          f"takes {target['step_ms']:.2f} ms: k = 4 drafts cost {4 * d['step_ms'] / target['step_ms']:.1f} "
          "target forwards.")
    synthetic = [r for r in rows if r["arm"] == "synthetic a=0.8"]
    drafted = [r for r in rows if r["arm"] == "1B draft a=0.8"]
    kept = [dr["speedup"] / s["speedup"] for dr, s in zip(drafted, synthetic)]
    print("At the same pinned acceptance (0.8) the 1B draft's real forwards kept "
          f"{min(kept):.2f}-{max(kept):.2f} of the free drafts' speedup over the concurrencies.")
    points = gpu["profile"]["hardware"]["fit"]["points"]
    eager = [p for p in points if p["kind"] == "prefill"]
    decode1 = next(p for p in points if p["kind"] == "decode" and p["num_requests"] == 1 and p["k"] == 0)
    chunks = ", ".join(f"{1000 * p['time_s']:.0f} ms for {p['num_tokens']} tokens" for p in eager)
    print(f"A prompt chunk step runs eagerly: {chunks}, against {1000 * decode1['time_s']:.1f} ms for a "
          "batch-1 decode step replayed from a graph.")
    mode = load_hardware("h200@minispec-cuda-graphs")
    print(f"Fitted for minispec on the H200: {1e6 * mode.layer_overhead_s:.0f} us per layer of every "
          f"replayed forward, {1e3 * mode.eager_layer_overhead_s:.1f} ms per layer of an eager one, "
          f"{1e3 * mode.request_overhead_s:.2f} ms per request in a step, and "
          f"{1e3 * mode.draft_request_overhead_s:.2f} ms per request in each draft forward: the drafter's "
          "own Python (building each request's tree) is what the draft arm pays most at high concurrency.")


def crossover_explorer(workload: dict, drafts: dict) -> None:
    """Notebook 05's explorer: sliders for alpha, k, the draft, the device and the engine's fixed time
    per step drive the simulator (one wave of max(16, c) requests of ``workload`` per load).

    ``drafts``: label -> draft model name, or None for a free drafter (synthetic acceptance). Only
    devices whose usable memory (90%) holds the 8B target and the 1B draft in bfloat16 are offered
    ("this", the CPU ``python -m minispec profile`` fits, is no GPU).
    """
    weights = load_model_spec("llama-3-8b").weight_bytes + load_model_spec("llama-3.2-1b").weight_bytes
    fits = [h for h in available_hardware() if h != "this"
            and 0.9 * load_hardware(h).memory_bytes > 1.05 * weights]

    def tok_s(hardware, step_overhead_ms, c, **spec):
        hw = hardware_with_overhead(hardware, step_overhead_ms=step_overhead_ms)
        return sweep(hardware=hw, concurrency=[c], num_requests=max(16, c), **workload,
                     **spec)[0]["throughput_tok_s"]

    @functools.lru_cache(maxsize=None)
    def off_tok_s(hardware, step_overhead_ms, c):  # spec off does not depend on alpha, k or the draft
        return tok_s(hardware, step_overhead_ms, c, draft=None, methods="off")

    def explore(alpha=0.8, k=4, draft=next(iter(drafts)), hardware="h100", max_concurrency=128,
                step_overhead_ms=1.21):
        alpha = round(alpha, 2)  # the slider's 0.1 + 14 x 0.05 is 0.7999999999999999
        cs = [c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= max_concurrency]
        method = "draft" if drafts[draft] else "synthetic"
        s = [tok_s(hardware, step_overhead_ms, c, draft=drafts[draft], alpha=alpha, k=k, methods=method)
             / off_tok_s(hardware, step_overhead_ms, c) for c in cs]
        _, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(cs, s, marker="o")
        speedup_axes(ax, "speedup over spec off")
        ax.set_title(f"{hardware}, {step_overhead_ms:.2f} ms per step, {workload['max_tokens']}-token "
                     f"outputs: {s[0]:.2f}x at c=1; " + below_one_text(cs, s))
        plt.show()

    interact(explore, alpha=w.FloatSlider(value=0.8, min=0.1, max=0.95, step=0.05, continuous_update=False),
             k=w.IntSlider(value=4, min=1, max=8, continuous_update=False), draft=list(drafts), hardware=fits,
             max_concurrency=w.SelectionSlider(options=[8, 32, 128, 256], value=128, continuous_update=False),
             step_overhead_ms=w.FloatSlider(value=1.21, min=0.0, max=3.0, step=0.1, continuous_update=False))


def gpu_thresholds(gpu: dict) -> dict[str, tuple[int, int]]:
    """Notebook 07: where ``threshold:N`` would sit for each drafter of the committed GPU run, placed
    by the threshold exercise's reference rule on the measured points and on the fitted simulator's
    prediction for the same waves; printed with the caution a one-wave curve needs.
    Returns: arm -> (N from the measured points, N from the simulated ones); 0 means it loses already
    at concurrency 1, the largest concurrency run means it never loses."""
    rows = crossover_rows(gpu)
    out = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        mine = [r for r in rows if r["arm"] == arm]
        measured = [{"spec": arm, "concurrency": r["concurrency"], "speedup_vs_off": r["speedup"]}
                    for r in mine]
        simulated = [{**m, "speedup_vs_off": r["simulated_speedup"]} for m, r in zip(measured, mine)]
        out[arm] = (reference_threshold(measured, arm), reference_threshold(simulated, arm))
        points = ", ".join(f"{r['speedup']:.2f}x at c={r['concurrency']}" for r in mine)
        top = mine[-1]["concurrency"]
        said = lambda n: (f"never loses up to c={top} (always)" if n == top else
                          "loses at c=1 (never)" if n == 0 else f"threshold:{n}")
        print(f"{arm}: {points}")
        print(f"  measured: {said(out[arm][0])}; the fitted simulator: {said(out[arm][1])}")
    top = max(r["concurrency"] for r in rows)
    print(headline(f"{gpu['device']['name']}, one wave per point: " + "; ".join(
        f"{arm} " + ("always, up to c=%d" % top if n == top else "never" if n == 0 else f"threshold:{n}")
        for arm, (n, _) in out.items())))
    print("Each point is one wave, so one noisy point below 1.0 sets the measured threshold early; a "
          "threshold for production comes from repeated runs, and the policy's hysteresis (back on only "
          "after the load stayed at or below N - N/4) keeps the engine from switching at every wobble around "
          "it.")
    return out
