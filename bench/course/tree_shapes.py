"""Draft-tree shapes for the shipped EAGLE head at concurrency 1: speed over spec off and tokens per verify.

The bundled target, its shipped head (``smollm2-135m-draft``), greedy decoding, the engine's
default settings, held-back chat prompts (data/prompts/chat.jsonl: never used in training), one
request at a time. Each round runs spec off, then every setting (chains and trees, written
DEPTH/TOPK/NODES), in a rotating order so no setting always runs right after another; each
setting's speedup is its tokens/s over the spec-off run of the same round, and the table keeps
the median of the rounds with their range. Every setting's output must equal spec off's token for
token (greedy speculation is exact); the script says so for each. Prints a table and writes JSON
(default bench/results/tree_shapes.json). A benchmark script, not a test: nothing else should run.

Usage: python -m bench tree_shapes [--shapes 2,4,4/4/8,5/8/16] [--rounds 3] [--num-prompts 8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.tools.summary import StepLog
from minispec.models.draft import load_draft
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.models.machine import machine_name
from minispec.core.request import SamplingParams
from minispec.tools.workload import load_prompts

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_shape(text: str) -> SpecConfig:
    """"4" -> a chain of 4; "4/4/8" -> a tree of depth 4, 4 children per node, 8 nodes."""
    parts = [int(x) for x in text.split("/")]
    if len(parts) == 1:
        return SpecConfig(method="draft", num_speculative_tokens=parts[0])
    depth, topk, nodes = parts
    return SpecConfig(method="draft", num_speculative_tokens=depth, draft_topk=topk, num_draft_tokens=nodes)


def run(engine, prompts, params) -> dict:
    """Every prompt alone (concurrency 1); tokens/s over the whole run, tokens per verify step,
    the step-time shares of drafting and the target's forward, and the outputs."""
    log = engine.add_observer(StepLog())
    start = time.perf_counter()
    outputs, emitted, verifies = [], 0, 0
    for p in prompts:
        rid = engine.add_request(p, params)
        engine.run_until_done()
        r = engine.requests[rid]
        outputs.append(r.output_token_ids)
        emitted += r.num_verify_emitted
        verifies += r.num_verify_steps
    wall = time.perf_counter() - start
    steps = log.stats
    return {"tok_s": sum(len(o) for o in outputs) / wall, "outputs": outputs,
            "mean_accepted_length": emitted / verifies if verifies else None,
            "draft_s": sum(s.draft_time_s for s in steps), "target_s": sum(s.target_time_s for s in steps),
            "num_steps": len(steps)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2,4,3/2/4,4/2/6,4/4/8,4/4/12,5/8/16",
                   help="chains K and trees DEPTH/TOPK/NODES, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", default=None, help="default bench/results/tree_shapes.json")
    args = p.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    specs = {s: parse_shape(s) for s in shapes}
    device = torch.device("cpu")
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, device, torch.float32)
    draft = load_draft("smollm2-135m-draft", model, device, torch.float32)
    prompts = load_prompts("chat")[: args.num_prompts]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)

    def engine_for(spec: SpecConfig | None):
        config = EngineConfig(model=BUNDLED_TARGET, device="cpu", max_model_len=2048, spec=spec or SpecConfig())
        return build_engine(config, model, tokenizer, hf_config, draft=draft if spec else None)

    engine_for(None)  # warm the kernels' packed weights before the first timed run
    runs: dict[str, list[dict]] = {s: [] for s in ["off", *shapes]}
    for rnd in range(args.rounds):
        order = shapes[rnd % len(shapes):] + shapes[: rnd % len(shapes)]
        off = run(engine_for(None), prompts, params)
        runs["off"].append(off)
        for s in order:
            r = run(engine_for(specs[s]), prompts, params)
            r["speedup"] = r["tok_s"] / off["tok_s"]
            r["exact"] = r["outputs"] == off["outputs"]
            runs[s].append(r)
            print(f"round {rnd + 1} {s:>8}: {r['tok_s']:6.1f} tok/s ({r['speedup']:.2f}x of {off['tok_s']:.1f}), "
                  f"{r['mean_accepted_length']:.2f} tokens per verify, exact {r['exact']}", file=sys.stderr, flush=True)
    rows = []
    for s in shapes:
        rs = runs[s]
        speedups = sorted(r["speedup"] for r in rs)
        spec = specs[s]
        rows.append({"shape": s, "k": spec.num_speculative_tokens, "draft_topk": spec.draft_topk,
                     "num_draft_tokens": spec.draft_shape.num_draft_tokens, "speedup_vs_off": statistics.median(speedups),
                     "speedup_range": [speedups[0], speedups[-1]],
                     "mean_accepted_length": statistics.median(r["mean_accepted_length"] for r in rs),
                     "tok_s": statistics.median(r["tok_s"] for r in rs),
                     "draft_share": statistics.median(r["draft_s"] / (r["draft_s"] + r["target_s"]) for r in rs),
                     "exact": all(r["exact"] for r in rs)})
    off_tok_s = statistics.median(r["tok_s"] for r in runs["off"])
    print(f"spec off: {off_tok_s:.1f} tok/s (median of {args.rounds} rounds)")
    print(f"{'shape':>8} {'nodes':>5} {'tok/s':>7} {'speedup':>8} {'range':>12} {'tok/verify':>10} {'draft share':>11} exact")
    for r in rows:
        print(f"{r['shape']:>8} {r['num_draft_tokens']:>5} {r['tok_s']:7.1f} {r['speedup_vs_off']:7.2f}x "
              f"{r['speedup_range'][0]:5.2f}-{r['speedup_range'][1]:.2f}x {r['mean_accepted_length']:10.2f} "
              f"{r['draft_share']:11.2f} {r['exact']}")
    out = {"rows": rows, "off_tok_s": off_tok_s, "rounds": args.rounds, "num_prompts": args.num_prompts,
           "max_tokens": args.max_tokens, "prompts": "chat",
           "machine": {"cpu": machine_name(), "capability": torch.backends.cpu.get_cpu_capability(),
                       "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
                       "platform": platform.platform(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d")}}
    path = Path(args.json) if args.json else RESULTS / "tree_shapes.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"[tree_shapes] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
