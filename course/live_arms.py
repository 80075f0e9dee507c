"""Speculation arms on the live engine, measured in interleaved rounds, and the cached sweeps beside them.

``LiveArms`` runs speculation arms on the live engine, each against spec off on its own prompts, in
interleaved rounds, and keeps their verdicts and counters; ``verdict_notes`` words what an arm's
verdicts at two loads say. ``cached_bench`` and ``cached_curve`` read this repository's cached
benchmarks (bench/results/). Notebooks 05 and 06's reports (course.crossover_reports,
course.cost_reports) draw and word what these measured; course.messenger_lab gathers them all.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from minispec.build import build_engine
from minispec.base.config import EngineConfig
from course.claims import draft_time_share
from course.noise import Verdict, compare, interleaved_rounds
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import SamplingParams
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
