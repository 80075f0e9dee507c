"""Calibration: the simulator on ``--hardware this`` against the real engine on this machine.

Run ``python -m minispec profile`` first (it fits data/hardware/this.json), then this script: it
runs bench's closed-loop workload on the real bundled model and the same workload in the
simulator (same prompts, tokenized the same way, same scheduler settings and spec settings), and
prints throughput and p50 TPOT side by side with the relative error. A shared machine's speed
drifts between the profile and the runs, so before and after each concurrency a batch-1 decode
step is timed against the fit ("drift", 1.0 = as profiled), and the errors are also shown with
the simulator scaled by it. Writes JSON
(bench/results/calibration.json by default). Not a test: both sides depend on this machine.

    python -m minispec profile
    python -m bench calibrate [--concurrency 1,4,16] [--specs off,synthetic] [--max-tokens 32]
    python -m bench calibrate --concurrency 1,8 --draft-topk 4 --num-draft-tokens 8   # draft trees
    python -m bench calibrate --concurrency 8 --specs off --prompts shared --prefix-caching off,on

With ``--draft-topk`` / ``--num-draft-tokens`` the speculating settings draft trees (the synthetic
drafter proposes the shape the simulator prices and both clocks draw paths from the same top-c
agreement law), so the comparison tests how the simulator prices tree rows and attention. With
``--prefix-caching off,on`` every setting runs both ways (a shared system prompt: hits cost no
compute in either).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

from minispec.tools.bench import bench_rows, spec_configs
from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.request import SamplingParams
from minispec.cost.model import CostModel
from minispec.cost.hardware import load_hardware
from minispec.cost.modelspec import ModelSpec
from minispec.sim.sweep import sim_rows
from minispec.tools.workload import load_prompts


def reference_drift(build, prompt_ids: list[int], cost_model) -> float:
    """This machine's speed now against the fitted one: measured / predicted seconds of a plain
    batch-1 decode step (median of 5). A shared machine drifts by tens of percent over minutes."""
    engine = build(SpecConfig())
    engine.add_request(prompt_ids, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    engine.step()  # prefill
    engine.step()  # warm-up decode
    ratios = []
    for _ in range(5):
        req = next(iter(engine.requests.values()))
        predicted = cost_model.items_cost([(1, req.num_computed_tokens, 1)]).time_s
        t0 = time.perf_counter()
        engine.step()
        ratios.append((time.perf_counter() - t0) / predicted)
    del engine
    gc.collect()
    return statistics.median(ratios)


def median_row(rows: list[dict]) -> dict:
    """The row of repeated runs with median throughput, its TPOT replaced by the median TPOT."""
    ordered = sorted(rows, key=lambda r: r["throughput_tok_s"])
    row = dict(ordered[len(ordered) // 2])
    row["tpot_p50_s"] = statistics.median(r["tpot_p50_s"] for r in rows)
    row["real_throughputs_tok_s"] = [r["throughput_tok_s"] for r in rows]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--specs", default="off,synthetic")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--draft-topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--prefix-caching", default="off", help="off, on, or off,on")
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompts", default="chat")
    p.add_argument("--requests-per-slot", type=int, default=2, help="requests = max(4, this x concurrency)")
    p.add_argument("--hardware", default="this")
    p.add_argument("--repeats", type=int, default=3, help="real runs per row; the median is compared "
                   "(a shared machine's speed drifts from minute to minute)")
    p.add_argument("--json", default=str(Path(__file__).resolve().parents[1] / "results" / "calibration.json"))
    args = p.parse_args()

    from minispec.build import build_engine
    from minispec.models.loader import load_model, pick_device, pick_dtype

    conc = [int(c) for c in args.concurrency.split(",")]
    specs = spec_configs(args.specs, args.k, "always", None, args.alpha, draft_topk=args.draft_topk,
                         num_draft_tokens=args.num_draft_tokens)
    cachings = [x.strip() == "on" for x in args.prefix_caching.split(",")]
    prompts = load_prompts(args.prompts)
    base = EngineConfig(model=args.model)
    device = pick_device(base.device)
    model, tokenizer, hf_config = load_model(args.model, device, pick_dtype(base.dtype, device))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    results = []
    t0 = time.perf_counter()
    hardware = load_hardware(args.hardware)
    cost_model = CostModel(hardware, ModelSpec.of(replace(model.cfg, name=args.model), hardware.default_dtype))
    first_prompt = build_engine(base, model, tokenizer, hf_config).tokenize(prompts[0])

    def build(spec, caching=False):
        return build_engine(replace(base, spec=spec, enable_prefix_caching=caching), model, tokenizer, hf_config)

    for c, caching in ((c, caching) for c in conc for caching in cachings):
        n = max(4, args.requests_per_slot * c)
        drifts = [reference_drift(build, first_prompt, cost_model)]
        runs = []
        for _ in range(args.repeats):
            runs.append(bench_rows(lambda spec: build(spec, caching), specs, [c], n, prompts, params, progress=False))
            gc.collect()  # drop each engine's KV pool before the next one
        drifts.append(reference_drift(build, first_prompt, cost_model))
        drift = statistics.mean(drifts)
        real = [median_row([run[i] for run in runs]) for i in range(len(specs))]
        sim = sim_rows(replace(base, enable_prefix_caching=caching), specs, [c], n, prompts, args.max_tokens,
                       hardware=args.hardware, model=args.model, tokenizer=tokenizer, warmup=True)
        for r, s in zip(real, sim):
            row = {"concurrency": c, "spec": r["spec"], "num_requests": n, "prefix_caching": caching,
                   "draft_topk": args.draft_topk, "num_draft_tokens": args.num_draft_tokens,
                   "real_hit_rate": r.get("prefix_cache_hit_rate"), "sim_hit_rate": s.get("prefix_cache_hit_rate"),
                   "real_ttft_p50_s": r["ttft_p50_s"], "sim_ttft_p50_s": s["ttft_p50_s"],
                   "real_tok_s": r["throughput_tok_s"], "sim_tok_s": s["throughput_tok_s"],
                   "real_tpot_p50_s": r["tpot_p50_s"], "sim_tpot_p50_s": s["tpot_p50_s"],
                   "real_speedup": r["speedup_vs_off"], "sim_speedup": s["speedup_vs_off"],
                   "real_runs_tok_s": r["real_throughputs_tok_s"],
                   "load_avg_1min": os.getloadavg()[0]}
            row["tok_s_error"] = s["throughput_tok_s"] / r["throughput_tok_s"] - 1
            row["tpot_error"] = s["tpot_p50_s"] / r["tpot_p50_s"] - 1
            # the same comparison with the simulator slowed (or sped) by the measured drift
            row["machine_drift"] = drift
            row["tok_s_error_drift_corrected"] = s["throughput_tok_s"] / drift / r["throughput_tok_s"] - 1
            row["tpot_error_drift_corrected"] = s["tpot_p50_s"] * drift / r["tpot_p50_s"] - 1
            results.append(row)
            print(f"c={c:3d} {r['spec']:9s} real {r['throughput_tok_s']:7.1f} tok/s, sim {s['throughput_tok_s']:7.1f} "
                  f"({row['tok_s_error']:+.1%}); TPOT p50 real {1000 * r['tpot_p50_s']:6.1f} ms, sim "
                  f"{1000 * s['tpot_p50_s']:6.1f} ms ({row['tpot_error']:+.1%})", flush=True)
    off = {(r["concurrency"], r["prefix_caching"]): r for r in results if r["spec"] == "off"}
    for row in results:  # speedups from the median rows
        key = (row["concurrency"], row["prefix_caching"])
        if key in off:
            row["real_speedup"] = row["real_tok_s"] / off[key]["real_tok_s"]
            row["sim_speedup"] = row["sim_tok_s"] / off[key]["sim_tok_s"]
    print("\nconcurrency | spec      | real tok/s | sim tok/s | error  | real TPOT p50 ms | sim TPOT p50 ms | error  "
          "| speedup real / sim | drift | errors drift-corrected")
    for row in results:
        print(f"{row['concurrency']:11d} | {row['spec']:9s} | {row['real_tok_s']:10.1f} | {row['sim_tok_s']:9.1f} | "
              f"{row['tok_s_error']:+6.1%} | {1000 * row['real_tpot_p50_s']:16.1f} | "
              f"{1000 * row['sim_tpot_p50_s']:15.1f} "
              f"| {row['tpot_error']:+6.1%} | {row['real_speedup']:.2f} / {row['sim_speedup']:.2f}        "
              f"| {row['machine_drift']:.2f}  | {row['tok_s_error_drift_corrected']:+6.1%} / "
              f"{row['tpot_error_drift_corrected']:+6.1%}")
    worst = max(max(abs(r["tok_s_error"]), abs(r["tpot_error"])) for r in results)
    corrected = max(max(abs(r["tok_s_error_drift_corrected"]), abs(r["tpot_error_drift_corrected"])) for r in results)
    print(f"\nworst relative error {worst:.1%} ({corrected:.1%} after the drift correction); "
          f"{time.perf_counter() - t0:.0f} s")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    Path(args.json).write_text(json.dumps({"settings": settings, "rows": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
