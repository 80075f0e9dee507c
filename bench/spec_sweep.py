"""Speculation against concurrency on the real engine, with the settings of each load run back to back.

The same sweep as ``python -m minispec bench --spec off,ngram,synthetic --concurrency 1,2,4,8,16``
(closed loop, 16 requests of 64 tokens, greedy, n-gram and synthetic drafts with k = 4 and
alpha = 0.6), but ordered load-major: at each concurrency, spec off, n-gram and synthetic run one
after the other (for every kernel variant: "reference", plain ``x @ W``, and "fast", oneDNN), so each
``speedup_vs_off`` compares runs made within a minute or two. The CLI sweep runs spec-major, and on
a shared machine the load drifts between its off rows and its speculative rows, minutes apart.
Rows come from ``minispec.tools.bench.bench_rows``, the function behind the CLI. Prints one table per
prompt set and variant plus a speedup summary; writes JSON rows. A benchmark script, not a test.

Usage: python bench/spec_sweep.py [--quick] [--prompts chat,copy] [--variants reference,fast] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# OpenMP's own wait policy (workers spin briefly) is what the notebooks and the CLI run with, so the
# benchmarks keep it. On a machine busy with other work, OMP_WAIT_POLICY=PASSIVE stops spinning
# workers stealing the time slice of the one they wait for; on a quiet 2-core machine it made a
# batch-1 decode step 1.6x slower (bench/decode_profile.py, 54 against 33 ms), so it is opt-in.

import torch  # noqa: E402

from minispec.tools.bench import bench_rows, format_table, spec_configs  # noqa: E402
from minispec.base.config import EngineConfig  # noqa: E402
from minispec.build import build_engine  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, load_model  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.tools.workload import load_prompts  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (c = 1 and 4, 4 requests of 16 tokens)")
    p.add_argument("--prompts", default="chat,copy", help="bundled prompt sets, comma-separated")
    p.add_argument("--variants", default="reference,fast", help="EngineConfig.kernels: reference, fast")
    p.add_argument("--spec", default="off,ngram,synthetic")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--concurrency", default="1,2,4,8,16")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-kv-blocks", type=int, default=640, help="KV pool per engine (16-token blocks)")
    p.add_argument("--json", default=None, help="output JSON (default bench/results/spec_sweep.json; "
                                                "--quick: spec_sweep_quick.json)")
    args = p.parse_args(argv)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if set(variants) - {"reference", "fast"} or not variants:
        p.error(f"--variants {args.variants!r}: choose from reference, fast")
    if args.quick:
        concurrencies, args.num_requests, args.max_tokens = [1, 4], 4, 16
    specs = spec_configs(args.spec, args.k, alpha=args.alpha)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    # both variants share the one model object: the prepared weights (EngineConfig.kernels) belong
    # to each engine's ModelRunner, never to the model

    def factory(variant):
        def make_engine(spec):
            config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", num_kv_blocks=args.num_kv_blocks,
                                  kernels=variant, spec=spec)
            return build_engine(config, model, tokenizer, hf_config)
        return make_engine

    rows, start = [], time.perf_counter()
    for prompt_set in [s.strip() for s in args.prompts.split(",") if s.strip()]:
        prompts = load_prompts(prompt_set)
        for c in concurrencies:
            for variant in variants:
                extra = {"model": BUNDLED_TARGET, "device": "cpu", "prompts": prompt_set, "variant": variant}
                rows += bench_rows(factory(variant), specs, [c], args.num_requests, prompts, params, progress=False,
                                   extra=extra)
            print(f"[spec_sweep] {prompt_set} c={c} done at {time.perf_counter() - start:.0f} s", file=sys.stderr)

    for prompt_set in dict.fromkeys(r["prompts"] for r in rows):
        for variant in variants:
            block = [r for r in rows if r["prompts"] == prompt_set and r["variant"] == variant]
            block.sort(key=lambda r: ([s.method for s in specs].index(r["spec"]), r["concurrency"]))
            print(f"\n== {prompt_set} prompts, {variant} ==")
            print(format_table(block))
    print("\nspeedup_vs_off (throughput / spec-off throughput at the same concurrency, measured back to back)")
    print(f"{'prompts':<8} {'variant':<7} {'spec':<10} " + " ".join(f"{f'c={c}':>6}" for c in concurrencies))
    for prompt_set in dict.fromkeys(r["prompts"] for r in rows):
        for variant in variants:
            for spec in specs:
                if not spec.enabled:
                    continue
                cells = [next(r["speedup_vs_off"] for r in rows if r["prompts"] == prompt_set
                              and r["variant"] == variant and r["spec"] == spec.method and r["concurrency"] == c)
                         for c in concurrencies]
                print(f"{prompt_set:<8} {variant:<7} {spec.method:<10} " + " ".join(f"{x:>5.2f}x" for x in cells))
    result = {"machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "num_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "dtype": "float32", "quick": args.quick},
              "k": args.k, "alpha": args.alpha, "num_requests": args.num_requests, "max_tokens": args.max_tokens,
              "wall_s": time.perf_counter() - start, "rows": rows}
    path = Path(args.json) if args.json else RESULTS / ("spec_sweep_quick.json" if args.quick else "spec_sweep.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"[spec_sweep] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
