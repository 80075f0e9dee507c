"""The simulator against published tables, point by point (issue 35; docs/cost_model.md, sec. 9).

For every table in data/published/ (each with its citation), runs each published point's
conditions on the simulator (minispec/sim/published_tables.py) and prints, per table and per
point, the published value (speedup, ratio, latency, step time or tokens/s), the simulated one and
the error (simulated / published - 1); then per table the median and worst error, per kind of
quantity the course's targets (speedups: median <= 10%, worst <= 20%; times and throughput
within 25%), and the shape checks (the simulated speedup falls where the published one falls).
Points marked "fit" fixed an unknown acceptance (or an engine mode) and are not counted.
Writes bench/results/sim_vs_published.json. Takes about a minute on a laptop CPU.

    python -m bench sim_vs_published [--tables specdecode_bench,nano_vllm] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from minispec.sim.published import available_tables, error_summary, load_table, shape_checks
from minispec.sim.published_tables import reproduce

UNITS = {"speedup": ("x", 1.0), "speedup_ratio": ("", 1.0), "draft_target_time_ratio": ("", 1.0),
         "latency_s": (" s", 1.0), "tpot_s": (" ms", 1e3), "throughput_tok_s": (" tok/s", 1.0)}


def fmt(value: float, quantity: str) -> str:
    unit, scale = UNITS[quantity]
    return f"{value * scale:.3g}{unit}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", default=",".join(available_tables()), help="comma-separated table names")
    p.add_argument("--json", default=str(Path(__file__).resolve().parents[1] / "results" / "sim_vs_published.json"))
    args = p.parse_args()
    t0 = time.perf_counter()
    all_results, tables = [], {}
    for name in [t.strip() for t in args.tables.split(",") if t.strip()]:
        data = load_table(name)
        results = reproduce(name)
        all_results += results
        print(f"\n== {data['title']}\n   {data['citation'].get('url') or data['citation'].get('paper')}")
        print(f"   {'point':30s} | {'published':>11s} | {'simulated':>11s} | {'error':>7s} |")
        for r in results:
            tag = " (fit)" if r.fitted else ""
            print(f"   {r.point:30s} | {fmt(r.published, r.quantity):>11s} | {fmt(r.simulated, r.quantity):>11s} | "
                  f"{r.error:+7.1%} | {r.label}{tag}")
        errs = [abs(r.error) for r in results if not r.fitted]
        summary = {"median_abs_error": statistics.median(errs), "worst_abs_error": max(errs), "num_points": len(errs)}
        print(f"   predicted points: {len(errs)}, median |error| {summary['median_abs_error']:.1%}, "
              f"worst {summary['worst_abs_error']:.1%}")
        tables[name] = {"title": data["title"], "citation": data["citation"], "summary": summary,
                        "points": [r.to_dict() for r in results]}
    overall = error_summary(all_results)
    shape = shape_checks(all_results)
    print("\n== All tables")
    for kind, s in overall.items():
        print(f"   {kind:10s}: {s['num_points']:2d} points, median |error| {s['median_abs_error']:.1%} "
              f"(target {s['target_median']:.0%}), worst {s['worst_abs_error']:.1%} (target {s['target_worst']:.0%}): "
              + ("met" if s["met"] else "MISSED"))
    print("   shape: " + ("holds at every point" if not shape else "; ".join(shape)))
    print(f"[minispec] {time.perf_counter() - t0:.0f} s")
    out = {"tables": tables, "overall": overall, "shape_violations": shape}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
