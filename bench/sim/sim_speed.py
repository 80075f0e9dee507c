"""Simulator speed: how long 10,000 simulated requests take at concurrency 64 on this machine.

The simulator runs minispec's own scheduler, engine and metrics in Python, so its speed is the
engine's per-step bookkeeping; the roofline arithmetic is a few dozen operations per step.
Prints a table and writes JSON (bench/results/sim_speed.json by default). Not a test: timings
depend on the machine and on what else runs on it.

    python -m bench sim_speed [--num-requests 10000] [--concurrency 64] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import SamplingParams
from minispec.sim import build_sim_engine
from minispec.tools.workload import run_closed_loop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--specs", default="off,draft", help="spec methods to time (off, synthetic, draft)")
    p.add_argument("--json", default=str(Path(__file__).resolve().parents[1] / "results" / "sim_speed.json"))
    args = p.parse_args()
    rows = []
    for method in args.specs.split(","):
        # the prompts are placeholders of one id: prefix caching would make every one a hit
        config = EngineConfig(model="llama-3-8b", enable_prefix_caching=False,
                              scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256),
                              spec=SpecConfig(method=method, num_speculative_tokens=4, alpha=0.8))
        engine = build_sim_engine(config, hardware="h100", draft="llama-3.2-1b" if method == "draft" else None)
        log = engine.add_observer(StepLog())
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        reqs, sim_s = run_closed_loop(engine, [[0] * args.prompt_len], args.concurrency, args.num_requests, params)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        summary = summarize(reqs, sim_s, log.stats)
        rows.append({"spec": method, "num_requests": args.num_requests, "concurrency": args.concurrency,
                     "prompt_len": args.prompt_len, "max_tokens": args.max_tokens, "num_steps": len(log.stats),
                     "wall_s": wall, "cpu_s": cpu, "simulated_s": sim_s,
                     "simulated_throughput_tok_s": summary["throughput_tok_s"],
                     "steps_per_s": len(log.stats) / wall, "load_avg_1min": os.getloadavg()[0]})
    print("spec      | requests | conc | out tok | steps  | wall s | cpu s | sim s  | sim tok/s | load")
    for r in rows:
        print(f"{r['spec']:9s} | {r['num_requests']:8d} | {r['concurrency']:4d} | {r['max_tokens']:7d} | "
              f"{r['num_steps']:6d} | {r['wall_s']:6.2f} | {r['cpu_s']:5.2f} | {r['simulated_s']:6.1f} | "
              f"{r['simulated_throughput_tok_s']:9.0f} | {r['load_avg_1min']:.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
