"""The messenger against the truck, measured: the experiments of notebooks 05 and 06 as functions.

A notebook cell states the run (which arms, which loads, which clock); the functions here run the
arms in interleaved rounds, draw the charts and word the verdicts, so each sentence a learner reads
is computed from the run beside it. ``LiveArms`` runs speculation arms on the live engine, each
against spec off on its own prompts; the ``report_*`` functions plot and print one experiment each.
Taught in notebooks/05_messenger_vs_truck.ipynb and notebooks/06_what_speculation_costs.ipynb.
"""

from __future__ import annotations

import functools
import gc
import json
import statistics
from pathlib import Path

import ipywidgets as w
import matplotlib.pyplot as plt

from minispec.build import build_engine
from minispec.base.config import EngineConfig
from course import headline, interact
from course.claims import draft_time_share
from course.exercises import reference_threshold
from course.gpu import crossover_rows, plot_crossover
from course.noise import Verdict, compare, interleaved_rounds
from course.plots import speedup_axes
from course.published import hardware_with_overhead
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import SamplingParams
from minispec.sim import available_hardware, load_hardware, load_model_spec, sweep
from minispec.tools.workload import run_closed_loop

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"
CONCURRENCY_TICKS = [1, 2, 4, 8, 16, 32]


def cached_bench(name: str) -> tuple[list[dict], str | None]:
    """A cached benchmark of this repository (bench/results/NAME.json): its rows and a label saying
    where and when it ran; ([], None) when the file is absent."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return [], None
    data = json.loads(path.read_text())
    m = data["machine"]
    return data["rows"], (f"cached {m['date']}, {m.get('cpu_count', '?')}-core "
                          f"{m['platform'].split('-')[0]}, torch {m['torch']}")


def cached_curve(rows: list[dict], prompts: str, method: str, k: int,
                 nodes: int | None = None) -> list[tuple]:
    """One setting's points of a cached crossover sweep, by concurrency: (c, speedup, low, high).
    ``nodes`` selects a tree's node count (default ``k``: a chain)."""
    nodes = nodes or k
    rs = sorted((r for r in rows if r["prompts"] == prompts and r["spec"] == method and r["k"] == k
                 and (r.get("num_draft_tokens") or k) == nodes), key=lambda r: r["concurrency"])
    return [(r["concurrency"], r["speedup_vs_off"], *r.get("speedup_range", [r["speedup_vs_off"]] * 2))
            for r in rs]


class LiveArms:
    """Speculation arms on the live engine, each compared with spec off on its own prompts.

    Args:
        model, tokenizer: the loaded target (shared by every arm's engine).
        arms: name -> (prompt set, SpecConfig); the prompt set names a key of ``prompt_ids``.
        base: speculating arm -> the spec-off arm it is compared with.
        prompt_ids: prompt set -> list of token-id lists.
        max_tokens: output tokens per request (greedy).
    One engine per arm is built once and reused by every round; each is warmed up on one request.
    """

    def __init__(self, model, tokenizer, arms: dict, base: dict, prompt_ids: dict, max_tokens: int):
        self.arms, self.base, self.prompt_ids = arms, base, prompt_ids
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0)
        self.engines, self.logs, self.runs = {}, {}, {}
        self.tok_s: dict[int, dict[str, list[float]]] = {}
        self.verdict: dict[tuple[str, int], Verdict] = {}
        for name, (prompt_set, spec) in arms.items():
            config = EngineConfig(spec=spec, enable_prefix_caching=False)
            self.engines[name] = build_engine(config, model=model, tokenizer=tokenizer)
            self.logs[name] = self.engines[name].add_observer(StepLog())
            run_closed_loop(self.engines[name], prompt_ids[prompt_set][:1], 1, 1,
                            SamplingParams(max_tokens=4, temperature=0))  # warm-up

    def _arm(self, name: str, c: int):
        """One run of an arm at concurrency c: output tokens/s; its summary is kept in ``runs``."""
        def run():
            self.logs[name].clear()
            reqs, wall = run_closed_loop(self.engines[name], self.prompt_ids[self.arms[name][0]], c,
                                         max(c, 2),
                                         self.params)
            s = summarize(reqs, wall, self.logs[name].stats)
            s["draft_time_share"] = draft_time_share(self.logs[name])
            self.runs.setdefault((name, c), []).append(s)
            return s["throughput_tok_s"]
        return run

    def run(self, concurrency: list[int], rounds: int) -> None:
        """Every arm once per round at each concurrency, the order rotating; fills ``tok_s`` (c -> arm
        -> tokens/s per round) and ``verdict`` ((arm, c) -> the paired comparison with its base)."""
        self.concurrency = list(concurrency)
        self.rounds = rounds
        for c in concurrency:
            print(f"concurrency {c}: {len(self.arms)} arms x {rounds} rounds")
            self.tok_s[c] = interleaved_rounds({name: self._arm(name, c) for name in self.arms},
                                               rounds=rounds)
        self.verdict = {(name, c): compare(self.tok_s[c][name], self.tok_s[c][b])
                        for name, b in self.base.items() for c in concurrency}

    def pooled(self, name: str, c: int, key: str) -> float | None:
        """A speculation counter of an arm, averaged over its rounds (None when no round has it)."""
        vals = [s[key] for s in self.runs[(name, c)] if s.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    def caveat(self, name: str, c: int) -> str:
        """The words a speedup needs when few drafts pass ("" when the acceptance rate is 0.2 or more)."""
        rate, length = self.pooled(name, c, "acceptance_rate"), self.pooled(name, c, "mean_accepted_length")
        if rate >= 0.2:
            return ""
        if "tree" in name:
            return (f" (acceptance rate {rate:.2f}: a tree proposes every node and at most one path passes, "
                    f"so read its mean accepted length, {length:.2f}, instead)")
        return (f" (acceptance rate {rate:.2f}: so few drafts pass that a gain this size sits inside the "
                "noise)")

    def print_summary(self) -> None:
        """One line per speculating arm and concurrency: the verdict and the acceptance counters
        (no padded columns: a line that long must wrap at spaces, see ``course.WrappedOutput``)."""
        for c in self.concurrency:
            for name in self.base:
                print(f"c={c}, {name}: {self.verdict[(name, c)].text()}; acceptance rate "
                      f"{self.pooled(name, c, 'acceptance_rate'):.2f}, mean accepted length "
                      f"{self.pooled(name, c, 'mean_accepted_length'):.2f}")

    def errorbar(self, ax, name: str, color: str, label: str) -> None:
        """An arm's measured speedups over its base, with the rounds' spread, on ``ax``."""
        vs = [self.verdict[(name, c)] for c in self.concurrency]
        ax.errorbar(self.concurrency, [v.ratio for v in vs],
                    yerr=[[v.ratio - v.low for v in vs], [v.high - v.ratio for v in vs]],
                    marker="o", capsize=4, color=color, label=label)

    def close(self) -> None:
        """Free the arms' engines (their KV caches and draft heads); the measurements stay."""
        self.engines.clear()
        self.logs.clear()
        gc.collect()


def verdict_notes(live: LiveArms, name: str) -> list[str]:
    """The sentences under a live arm's low- and high-load verdicts: agreement, a settled direction,
    a tie or noise, and a loss at c=1 that the acceptance cannot explain."""
    lo, hi = live.concurrency[0], live.concurrency[-1]
    v0, v1 = live.verdict[(name, lo)], live.verdict[(name, hi)]
    out = []
    if v0.clear and v1.clear:
        out.append("  The rounds agree at both loads: the speedup "
                   f"{'shrank' if v1.ratio < v0.ratio else 'did not shrink'} from c={lo} to c={hi}.")
    else:
        for c, v in ((lo, v0), (hi, v1)):
            if v.finding.startswith("probably"):
                out.append(f"  At c={c} every round fell on the same side ({v.spread_text()}) but not all "
                           "beyond the 5% dead zone: probably "
                           f"{'faster' if v.finding.endswith('higher') else 'slower'} than spec off, by a "
                           "margin this run cannot size.")
            elif v.finding == "tie":
                out.append(f"  At c={c} every round sat inside the 5% dead zone ({v.spread_text()}): no "
                           "difference this run can show.")
            elif v.finding == "noisy":
                out.append(f"  At c={c} the rounds disagreed on the direction ({v.spread_text()}): other "
                           "programs on the same cores, or requests too short to average out. Run the cell "
                           "again on a quiet machine before reading a trend into it.")
    length = live.pooled(name, lo, "mean_accepted_length")
    if v0.finding == "lower" and length >= 2:
        out.append(f"  It lost at c={lo} while emitting {length:.2f} tokens per verify: far more than a few "
                   "extra rows cost at batch 1, so a busy machine is the likely cause.")
    return out


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


def report_sim_crossover(sims: dict, grid: list[int]) -> dict:
    """The simulated crossover: speedup against concurrency per (hardware, alpha) sweep, plotted and
    set against the source notes' example. Returns (hardware, alpha) -> {c: speedup}."""
    speedup = {key: {r["concurrency"]: r["speedup_vs_off"] for r in rows if r["spec"] == "draft"}
               for key, rows in sims.items()}
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
        below = next((c for c in grid if s[c] < 1.0), None)
        print(f"{hw} alpha {alpha}: {s[1]:.2f}x at c=1, {s[32]:.2f}x at c=32, {s[128]:.2f}x at c=128; "
              + (f"below 1.0 from c={below}." if below else "never below 1.0 up to c=128."))
    good = [s for (hw, alpha), s in speedup.items() if alpha == 0.8]
    shrinks = all(s[32] < s[1] for s in good)
    print("Against the source notes' example (about 2x at c=1, 1.1x or 0.9x at c=32): the alpha-0.8 draft "
          f"{'loses ground' if shrinks else 'does not lose ground'} between c=1 and c=32 on both devices, "
          f"from {min(s[1] for s in good):.2f}-{max(s[1] for s in good):.2f}x to "
          f"{min(s[32] for s in good):.2f}-{max(s[32] for s in good):.2f}x.")
    return speedup


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


def report_gpu_crossover(gpu: dict) -> None:
    """The committed GPU run's crossover beside the fitted simulator: the chart, each arm's trend
    (a dip below 1.0 with a later point above settles no crossover), the c=32 points, the 1B draft's
    forward against the target's, and the host costs the fit found."""
    rows = crossover_rows(gpu)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    plot_crossover(ax, gpu)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    ax.set_title(headline(f"{gpu['device']['name']}, {gpu['date']}, minispec with CUDA graphs: " + "; ".join(
        f"{arm} {next(r['speedup'] for r in rows if r['arm'] == arm):.2f}x at c=1" for arm in arms)),
                 fontsize=9)
    ax.legend(fontsize=7)
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
    ("this", the CPU profiled in notebook 07, is no GPU).
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
        below = [c for c, v in zip(cs, s) if v < 1.0]
        ax.set_title(f"{hardware}, {step_overhead_ms:.2f} ms per step, {workload['max_tokens']}-token "
                     f"outputs: {s[0]:.2f}x at c=1; "
                     + (f"below 1.0 from c={below[0]}" if below else "never below 1.0 here"))
        plt.show()

    interact(explore, alpha=w.FloatSlider(value=0.8, min=0.1, max=0.95, step=0.05, continuous_update=False),
             k=w.IntSlider(value=4, min=1, max=8, continuous_update=False), draft=list(drafts), hardware=fits,
             max_concurrency=w.SelectionSlider(options=[8, 32, 128, 256], value=128, continuous_update=False),
             step_overhead_ms=w.FloatSlider(value=1.21, min=0.0, max=3.0, step=0.1, continuous_update=False))


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
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
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
    ax.set_title(headline("Bulk lane TPOT with speculating neighbours: "
                          + ", ".join(f"{v:.2f}x {w}" for w, v in ratios.items())), fontsize=8)
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
    bx.set_title(headline("What the neighbours added per step: " + "; ".join(
        f"{w.split(' (')[0]} draft {d / r['plain']['steps']['step_s']:+.2f}, verify "
        f"{t / r['plain']['steps']['step_s']:+.2f} of a plain step"
        for (w, (d, t, o, a)), (_, r) in zip(share.items(), places))), fontsize=8)
    bx.legend(fontsize=7)
    plt.tight_layout()
    plt.show()
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
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    for (name, key), color in zip(shapes.items(), ("tab:orange", "tab:green")):
        short = name.split(": ")[1]
        live.errorbar(a, name, color, f"{short}, measured here")
        pts = cached_curve(tree_rows, "chat", *key)
        if pts:
            a.plot([p[0] for p in pts], [p[1] for p in pts], ls="--", marker=".", color=color, alpha=0.6,
                   label=f"{short}, {tree_where}")
    speedup_axes(a, "tokens/s over spec off (chat prompts)", CONCURRENCY_TICKS)
    a.set_title(headline("Here: " + "; ".join(f"{n.split(': ')[1]} c={c} {live.verdict[(n, c)].text()}"
                                              for n in shapes for c in live.concurrency)), fontsize=8,
                wrap=True)
    a.legend(fontsize=7)
    for name, s in gpu_speedup.items():
        b.plot(grid, [s[c] for c in grid], marker="o", label=f"{name} (mean accepted length "
                                                             f"{gpu_length[name]:.2f})")
    speedup_axes(b, "throughput over spec off", grid)
    below = {n: next((c for c in grid if s[c] < 1.0), None) for n, s in gpu_speedup.items()}
    b.set_title(headline("Simulated H100, 8B target, 1B draft, alpha 0.8: " + "; ".join(
        f"{n} {s[1]:.2f}x at c=1, " + (f"below 1.0 from c={below[n]}" if below[n] else "never below 1.0")
        for n, s in gpu_speedup.items())), fontsize=8, wrap=True)
    b.legend(fontsize=7)
    plt.tight_layout()
    plt.show()
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
