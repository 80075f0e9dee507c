"""The course's production-scale questions, answered by the simulator (numbers for docs/cost_model.md).

1. Llama-3-8B with a Llama-3.2-1B draft on an H100, k = 4: alpha 0.8 (a good route) and 0.3 (a
   JSON-like route), closed-loop concurrency 1..256: speedup against spec off, and where it drops
   below 1. Next to it, Leviathan et al.'s expected speedup at batch 1 from the cost model's c.
2. Llama-3-70B (fp8 weights, to fit one H200) with the same draft: the vLLM blog's setting, roughly.
3. Long context (MagicDec, Chen et al. 2024): Llama-3.1-8B on an H200 with 32k-token prompts against
   512-token prompts, with a full-KV draft and with a draft that keeps a 512-token KV window: the
   decode-phase speedup of one wave of requests (as many as the KV memory holds), plus the cost
   model's speedup at batch sizes one device cannot hold (memory permitting).
4. The adaptive policies (goodput, auto) against always and never.
Prints tables; writes bench/results/sim_scenarios.json. Runs in about a minute on a laptop CPU.

    python -m bench sim_scenarios [--num-requests 256] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from minispec.tools.bench import format_table
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.tools.summary import StepLog
from minispec.core.request import SamplingParams
from minispec.sim import CostModel, build_sim_engine, load_hardware, load_model_spec, sweep
from minispec.cost.model import leviathan_speedup
from minispec.tools.workload import run_closed_loop


def speedups(rows: list[dict]) -> dict:
    """concurrency -> (throughput speedup, TPOT ratio off / spec) for the speculating rows."""
    off = {r["concurrency"]: r for r in rows if r["spec"] == "off"}
    out = {}
    for r in rows:
        if r["spec"] != "off":
            base = off[r["concurrency"]]
            tpot = base["tpot_p50_s"] / r["tpot_p50_s"] if r["tpot_p50_s"] else None
            out[r["concurrency"]] = (r["speedup_vs_off"], tpot)
    return out


LONG_BATCHES = (1, 4, 16, 64, 256)


def decode_rate(hardware: str, model: str, draft: str, method: str, batch: int, prompt: int,
                window: int | None, max_tokens: int = 256) -> float:
    """Tokens per second over the steps that carry no prefill, for one wave of ``batch`` requests."""
    # the prompts are placeholders of one id: with prefix caching they would share every block
    config = EngineConfig(model=model, enable_prefix_caching=False,
                          scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=512),
                          spec=SpecConfig(method=method, num_speculative_tokens=4, alpha=0.8))
    engine = build_sim_engine(config, hardware=hardware, draft=draft, draft_kv_window=window)
    log = engine.add_observer(StepLog())
    # at least 2048 output tokens in all, so the sampled acceptance is close to its mean
    max_tokens = max(max_tokens, 2048 // batch)
    run_closed_loop(engine, [[0] * prompt], batch, batch, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    steps = [s for s in log.stats if s.num_prefill_tokens == 0]
    return sum(s.num_decode_tokens + s.num_draft_accepted for s in steps) / sum(s.duration_s for s in steps)


def crossover(rows: list[dict]) -> int | None:
    """Lowest concurrency whose throughput speedup is below 1 (None if none is)."""
    below = [c for c, (s, _) in sorted(speedups(rows).items()) if s < 1.0]
    return below[0] if below else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--json", default=str(Path(__file__).resolve().parents[1] / "results" / "sim_scenarios.json"))
    args = p.parse_args()
    t0 = time.perf_counter()
    results: dict = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    conc = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    common = dict(num_requests=args.num_requests, max_tokens=args.max_tokens, prompt_len=args.prompt_len, k=4,
                  max_num_seqs=512)

    # 1. the seed's shape on an H100
    for alpha in (0.8, 0.6, 0.3):
        rows = sweep("h100", "llama-3-8b", "llama-3.2-1b", alpha=alpha, concurrency=conc, **common)
        print(f"\n== H100, Llama-3-8B + Llama-3.2-1B draft, alpha {alpha}, k 4, prompt {args.prompt_len}, "
              f"output {args.max_tokens} ==")
        print(format_table(rows))
        results[f"h100_8b_alpha{alpha}"] = {"rows": rows, "crossover_concurrency": crossover(rows),
                                            "speedups": speedups(rows)}
    cm = CostModel(load_hardware("h100"), load_model_spec("llama-3-8b"), load_model_spec("llama-3.2-1b"))
    ctx = args.prompt_len + args.max_tokens // 2
    c_ratio = cm.forward_time_s(1, 1, ctx + 1, ctx + 1, 1, draft=True) / cm.forward_time_s(1, 1, ctx + 1, ctx + 1, 1)
    results["leviathan"] = {"cost_ratio_c": c_ratio,
                            **{f"alpha{a}": leviathan_speedup(a, 4, c_ratio) for a in (0.8, 0.6, 0.3)}}
    print(f"\nLeviathan et al. expected speedup at batch 1 with c = {c_ratio:.3f}: "
          + ", ".join(f"alpha {a}: {leviathan_speedup(a, 4, c_ratio):.2f}x" for a in (0.8, 0.6, 0.3)))

    # 2. a 70B target (fp8 weights fit one H200), the vLLM blog's model
    rows = sweep("h200", "llama-3-70b", "llama-3.2-1b", alpha=0.6, concurrency=(1, 4, 16, 64, 256),
                 weight_dtype="fp8", **common)
    print("\n== H200, Llama-3-70B (fp8 weights) + Llama-3.2-1B draft, alpha 0.6, k 4 ==")
    print(format_table(rows))
    results["h200_70b_fp8_alpha0.6"] = {"rows": rows, "crossover_concurrency": crossover(rows),
                                        "speedups": speedups(rows)}

    # 3. long context (MagicDec): memory-bound decode at any batch size. One wave of requests
    # (all prefill first), and the decode-only rate, so the 32k prefills do not hide the decode.
    long_rows = {}
    print("\n== H200, Llama-3.1-8B + Llama-3.2-1B draft, alpha 0.8, k 4, max(256, 2048 / B) output tokens: "
          "decode-phase speedup ==")
    print("prompt | draft KV window | " + " | ".join(f"B={b:<3d}" for b in LONG_BATCHES))
    for prompt, window in ((512, None), (32000, None), (32000, 512)):
        row = {}
        for b in LONG_BATCHES:
            if prompt * b > 640_000:  # H200: ~108 GB of KV for target + draft, 164 KB per token
                continue
            rates = [decode_rate("h200", "llama-3.1-8b", "llama-3.2-1b", method, b, prompt, window)
                     for method in ("off", "draft")]
            row[b] = rates[1] / rates[0]
        long_rows[f"prompt{prompt}_window{window}"] = row
        print(f"{prompt:6d} | {str(window):>15} | " + " | ".join(f"{row[b]:5.2f}" if b in row else "  -  "
                                                             for b in LONG_BATCHES))
    analytic = {}
    h200 = load_hardware("h200")
    for window in (None, 512):
        cmw = CostModel(h200, load_model_spec("llama-3.1-8b"), load_model_spec("llama-3.2-1b"), draft_kv_window=window)
        for context in (512, 4000, 32000):
            analytic[f"context{context}_window{window}"] = {
                b: cmw.speedup(b, context, 4, 0.8) for b in (1, 8, 32, 64, 128, 256, 512)}
    print("\nCost-model decode speedup, Llama-3.1-8B + 1B draft on H200, alpha 0.8, k 4 (memory permitting):")
    print("context | draft window | " + " | ".join(f"B={b:<3d}" for b in (1, 8, 32, 64, 128, 256, 512)))
    for key, row in analytic.items():
        context, window = key.removeprefix("context").split("_window")
        print(f"{context:>7} | {window:>12} | " + " | ".join(f"{v:5.2f}" for v in row.values()))
    results["long_context"] = {"simulated": long_rows, "cost_model_speedup": analytic}

    # 4. adaptive policies on the H100 sweep (enough requests for a steady state at c = 256)
    policy_rows = {}
    for policy in ("always", "goodput", "auto"):
        rows = sweep("h100", "llama-3-8b", "llama-3.2-1b", alpha=0.8, concurrency=(1, 8, 32, 128, 256),
                     policy=policy, **{**common, "num_requests": max(args.num_requests, 1024)})
        policy_rows[policy] = rows
    print("\n== H100, alpha 0.8: throughput (tok/s) by policy ==")
    print("conc | never | always | goodput | auto")
    def rate(policy: str, method: str, c: int) -> float:
        # bench_rows interleaves the loads (spec off, then speculation, at each concurrency)
        return next(r["throughput_tok_s"] for r in policy_rows[policy] if r["spec"] == method and r["concurrency"] == c)
    for c in (1, 8, 32, 128, 256):
        spec = [rate(p, "draft", c) for p in ("always", "goodput", "auto")]
        print(f"{c:4d} | {rate('always', 'off', c):5.0f} | " + " | ".join(f"{v:6.0f}" for v in spec))
    results["policies"] = policy_rows
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"\n[sim_scenarios] {time.perf_counter() - t0:.0f} s; wrote {args.json}")


if __name__ == "__main__":
    main()
