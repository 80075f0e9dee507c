"""Where speculation stops paying on this machine: speedup over spec off against concurrency.

The engine's default settings (fast kernels, float32), the bundled model, greedy decoding:
- copy prompts (copy and edit a passage): spec off, then n-gram speculation (prompt lookup, k 4);
- chat prompts: spec off, then the shipped EAGLE draft as a chain (k 2) and as a draft tree
  (depth 4, 4 children per node, 8 nodes: the wider messenger, issue 27), then synthetic
  acceptance (alpha 0.6, k 4: what a good draft would give, drafting for free).
At every concurrency each setting runs right after its prompt set's spec-off run (bench_rows
interleaves), so each speedup compares neighbouring runs. Writes JSON rows (with each row's mean
step time, the curve that explains the crossover) and a PNG: speedup against concurrency with
1.0 marked, and mean step time against concurrency. With ``--repeats N`` the whole sweep runs N
times, round after round, so a slow spell of a shared machine lands on different cells each round;
each row then carries the median speedup of its N runs and their range. A benchmark script, not a
test.

``--policy`` runs every speculating setting under one policy (e.g. threshold:4, lane), and
``--only`` keeps the settings whose label contains one of the given words (e.g. draft).

Usage: python -m bench crossover [--quick] [--concurrency 1,2,4,8,16,32] [--max-tokens 64] [--repeats 1]
       [--policy always] [--only draft,tree]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
import os
import platform
import sys
import time
from pathlib import Path

import torch

from minispec.tools.bench import bench_rows, format_table
from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.models.draft import load_draft
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.core.request import SamplingParams
from minispec.tools.workload import load_prompts

RESULTS = Path(__file__).resolve().parents[1] / "results"
SETTINGS = {  # prompt set -> speculation settings after spec off
    "copy": [SpecConfig(method="ngram", num_speculative_tokens=4)],
    "chat": [SpecConfig(method="draft", num_speculative_tokens=2),
             SpecConfig(method="draft", num_speculative_tokens=4, draft_topk=4, num_draft_tokens=8),
             SpecConfig(method="synthetic", num_speculative_tokens=4, alpha=0.6)],
}


def label(row: dict) -> str:
    """"chat: draft k=2", "chat: draft tree 4/4/8" (depth / children per node / nodes)."""
    if row["spec"] == "off":
        return f"{row['prompts']}: off"
    nodes = row.get("num_draft_tokens") or row["k"]
    shape = f" tree {row['k']}/{row['draft_topk']}/{nodes}" if nodes > row["k"] else f" k={row['k']}"
    return f"{row['prompts']}: {row['spec']}{shape}" + (f" ({row['policy']})" if row.get("policy") not in (None, "always") else "")


def summary(rows: list[dict]) -> list[str]:
    """Per speculating setting, from the data: its speedup at the lowest and the highest
    concurrency, and the first concurrency where it falls below 1.0x (if any)."""
    lines = []
    for name in dict.fromkeys(label(r) for r in rows if r["spec"] != "off"):
        rs = sorted((r for r in rows if label(r) == name), key=lambda r: r["concurrency"])
        below = next((r["concurrency"] for r in rs if r["speedup_vs_off"] < 1.0), None)
        lines.append(f"{name} {rs[0]['speedup_vs_off']:.2f}x at c={rs[0]['concurrency']} -> "
                     f"{rs[-1]['speedup_vs_off']:.2f}x at c={rs[-1]['concurrency']}"
                     + (f", below 1.0x from c={below}" if below else ""))
    return lines


def median_rows(rounds: list[list[dict]]) -> list[dict]:
    """One row per cell, each taken whole from one round so its step times and rates stay one run.

    A speculating cell keeps the round whose speedup is the median (the lower one for an even
    count), with every round's speedup, their range, and that same round's spec-off step time and
    throughput (``off_mean_step_s``, ``off_throughput_tok_s``: the run its speedup was measured
    against). A spec-off cell, whose speedup is 1.0 in every round, keeps the round whose
    throughput is the median, so its step time is a typical one rather than an arbitrary round's.
    """
    out = []
    for cells in zip(*rounds):
        key = "throughput_tok_s" if cells[0]["spec"] == "off" else "speedup_vs_off"
        ranked = sorted(range(len(cells)), key=lambda i: cells[i][key])
        pick = ranked[(len(ranked) - 1) // 2]
        row = dict(cells[pick])
        if row["spec"] != "off":
            off = next(r for r in rounds[pick] if r["spec"] == "off" and r["prompts"] == row["prompts"]
                       and r["concurrency"] == row["concurrency"])
            row.update(off_mean_step_s=off["mean_step_s"], off_throughput_tok_s=off["throughput_tok_s"])
        speedups = [r["speedup_vs_off"] for r in cells]
        out.append({**row, "repeats": len(cells), "speedups_vs_off": speedups,
                    "speedup_range": [min(speedups), max(speedups)]})
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(label(r) for r in rows):
        rs = [r for r in rows if label(r) == name]
        xs = [r["concurrency"] for r in rs]
        if rs[0]["spec"] != "off":
            ys = [r["speedup_vs_off"] for r in rs]
            spread = [[y - r.get("speedup_range", [y, y])[0] for y, r in zip(ys, rs)],
                      [r.get("speedup_range", [y, y])[1] - y for y, r in zip(ys, rs)]]
            a.errorbar(xs, ys, yerr=spread, marker="o", capsize=3, label=name)
        b.plot(xs, [1000 * r["mean_step_s"] for r in rs], marker="o", label=name)
    a.axhline(1.0, color="black", lw=1, ls="--")
    a.set_ylabel("tokens/s over spec off (same prompts, same concurrency)")
    b.set_ylabel("mean step time (ms)")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("; ".join(summary(rows)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: c 1 and 4, 2 requests, 16 tokens")
    p.add_argument("--concurrency", default="1,2,4,8,16,32")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--min-requests", type=int, default=8, help="requests per cell: max(this, 2 x concurrency)")
    p.add_argument("--repeats", type=int, default=1, help="rounds of the whole sweep; rows keep the median "
                   "speedup and its range")
    p.add_argument("--kernels", default="fast", choices=("fast", "reference"))
    p.add_argument("--policy", default="always", help="the speculation policy of every speculating setting")
    p.add_argument("--only", default=None, help="comma-separated words: keep the settings whose label has one")
    p.add_argument("--json", default=None, help="default bench/results/crossover.json")
    p.add_argument("--replot", action="store_true", help="redraw the PNG from the JSON file, run nothing")
    args = p.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if any(c < 1 for c in concurrencies) or min(args.max_tokens, args.min_requests, args.repeats) < 1:
        p.error("--concurrency values, --max-tokens, --min-requests and --repeats must be >= 1")
    if args.quick:
        concurrencies, args.max_tokens, args.min_requests = [1, 4], 16, 2
    if args.replot:
        path = Path(args.json) if args.json else RESULTS / ("crossover_quick.json" if args.quick else "crossover.json")
        rows = json.loads(path.read_text())["rows"]
        plot(rows, path.with_suffix(".png"))
        print("\n".join(summary(rows)))
        return 0
    device = torch.device("cpu")
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, device, torch.float32)
    draft = load_draft("smollm2-135m-draft", model, device, torch.float32)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def make_engine(spec: SpecConfig):
        config = EngineConfig(model=BUNDLED_TARGET, device="cpu", kernels=args.kernels, max_model_len=2048, spec=spec)
        return build_engine(config, model, tokenizer, hf_config, draft=draft if spec.method == "draft" else None)

    def keep(prompt_set: str, spec: SpecConfig) -> bool:
        if args.only is None:
            return True
        row = {"prompts": prompt_set, "spec": spec.method, "k": spec.num_speculative_tokens,
               "draft_topk": spec.draft_topk, "num_draft_tokens": spec.draft_shape.num_draft_tokens}
        return any(word in label(row) for word in args.only.split(","))

    chosen = {name: [replace(s, policy=args.policy) for s in settings if keep(name, s)]
              for name, settings in SETTINGS.items()}
    chosen = {name: settings for name, settings in chosen.items() if settings}
    rounds, start = [], time.perf_counter()
    for i in range(args.repeats):
        rows = []
        for c in concurrencies:
            for prompt_set, settings in chosen.items():
                prompts = load_prompts(prompt_set)
                new = bench_rows(make_engine, [SpecConfig(), *settings], [c], max(args.min_requests, 2 * c), prompts,
                                 params, progress=False, extra={"prompts": prompt_set, "kernels": args.kernels})
                rows += new
                for r in new:
                    print(f"round {i + 1} c={c:<3} {label(r):<28} {r['throughput_tok_s']:7.1f} tok/s  speedup "
                          f"{r['speedup_vs_off']:.2f}x  step {1000 * r['mean_step_s']:.0f} ms", file=sys.stderr)
        rounds.append(rows)
    rows = median_rows(rounds)
    print(format_table(rows))
    print("\n".join(summary(rows)))
    machine = {"platform": platform.platform(), "torch": torch.__version__, "num_threads": torch.get_num_threads(),
               "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "wall_s": time.perf_counter() - start}
    path = Path(args.json) if args.json else RESULTS / ("crossover_quick.json" if args.quick else "crossover.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "rows": rows}, indent=1))
    plot(rows, path.with_suffix(".png"))
    print(f"[crossover] wrote {path} and {path.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
