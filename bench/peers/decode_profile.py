"""Where a batch-1 decode step's time goes: a per-op profile against the memory roofline.

Runs batch-1 greedy decode of the bundled model on the engine's default settings (or the kernels
and weights given), profiles a window of decode steps with torch.profiler, and groups the CPU time
of every op by what it does: the weight matmuls (the part the roofline counts), the LM head,
attention (paged gather, masks, SDPA, KV writes), norms, rotary, sampling, and the rest; the step
wall time not covered by any op is Python and dispatch overhead. Prints a table and writes JSON.
The roofline: a decode step must read every weight once, so at the stream bandwidth measured in the
same run (a sum over a float32 tensor the size of the weights) it takes bytes / bandwidth.
A benchmark script, not a test.

``--compile on`` profiles the captured step instead (minispec/graphs/compiled_step.py): inductor's
one C++ function per bucket shows as one event, its GEMMs and fused small ops together ("compiled
graph"); the ops it calls out to (SDPA, and the K/V write after it) keep their groups, and what no
op covers is still Python and dispatch (the guard check before each call included).

Usage: python -m bench decode_profile [--kernels fast|reference] [--weights float32|bfloat16|int8|int4]
       [--compile on|off] [--rows-probe]
``--rows-probe`` times every projection of the layers per weight format at 1 to 9 rows at once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from minispec.build import build_engine
from minispec.base.config import EngineConfig
from minispec.tools.summary import StepLog
from minispec.models.kernels import PROJECTIONS, linear, prepare_weights, release_weights, weight_bytes_per_token
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.models.machine import machine_name
from minispec.core.request import SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results"
GROUPS = (  # (group, substrings of op names), first match wins
    ("compiled graph", ("compiledfxgraph",)),
    ("matmul", ("mkldnn", "bmm", "mm", "linear", "addmm", "quantized")),
    ("attention", ("scaled_dot_product", "attention", "index_select", "index_copy", "index_put",
                   "masked", "where", "gather", "softmax")),
    ("norm", ("rms_norm", "norm", "rsqrt", "pow", "mean")),
    ("rotary", ("roll", "cos", "sin", "cat")),
    ("elementwise", ("mul", "add", "silu", "sub", "div", "copy_", "to", "_to_copy", "clone", "contiguous")),
    ("tensor building", ("tensor", "empty", "arange", "zeros", "full", "ones", "lift", "view", "reshape", "split",
                         "unbind", "expand", "select", "slice", "transpose", "unflatten", "flatten", "stack")),
    ("sampling", ("argmax", "topk", "sort", "multinomial")),
)


def group_of(name: str) -> str:
    n = name.lower()
    for group, keys in GROUPS:
        if any(k in n for k in keys):
            return group
    return "other ops"


def weight_bytes(model) -> int:
    cfg = model.cfg
    return (cfg.num_layer_params + cfg.vocab_size * cfg.hidden_size) * 4


def bandwidth(num_bytes: int) -> float:
    x = torch.ones(num_bytes // 4)
    x.sum()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return num_bytes / best


def rows_probe(model, formats=("int4", "bfloat16", "float32"), rows=(1, 2, 4, 5, 8, 9), repeats: int = 15) -> dict:
    """Every projection of ``model``'s layers (the fused QKV, O, gate/up and down: 4 per layer) in
    each weight format on the fast kernels, for 1 to 9 rows at once: median ms per pass. What a
    verify of k + 1 rows costs against one decode row, per format: where the ridge sits."""
    out = {}
    for fmt in formats:
        prepared = prepare_weights(model, "fast", fmt)
        inputs = {n: getattr(model.layers[0], n).shape[0] for n in PROJECTIONS}
        out[fmt] = {}
        for m in rows:
            xs = {n: torch.randn(m, size) for n, size in inputs.items()}

            def one_pass():
                for i, layer in enumerate(model.layers):
                    for n in PROJECTIONS:
                        linear(xs[n], getattr(layer, n), prepared.layers[i][n])
            times = []
            with torch.inference_mode():
                for r in range(repeats + 3):
                    t = time.perf_counter()
                    one_pass()
                    if r >= 3:
                        times.append(time.perf_counter() - t)
            out[fmt][m] = 1000 * statistics.median(times)
        release_weights(model, "fast", fmt)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="fast", choices=("fast", "reference"))
    p.add_argument("--weights", default=None)
    p.add_argument("--steps", type=int, default=32, help="decode steps profiled")
    p.add_argument("--compile", choices=("on", "off"), default="off",
                   help="profile the captured step (torch.compile per bucket) instead of the eager one")
    p.add_argument("--rows-probe", action="store_true",
                   help="also time every projection per weight format at 1 to 9 rows (the ridge per format)")
    p.add_argument("--json", default=None, help="default bench/results/decode_profile[_KERNELS_WEIGHTS].json")
    args = p.parse_args(argv)
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    config = EngineConfig(model=BUNDLED_TARGET, device="cpu", kernels=args.kernels, weights=args.weights,
                          compile=args.compile == "on")
    engine = build_engine(config, model, tokenizer, hf_config)
    params = SamplingParams(max_tokens=args.steps + 24, temperature=0.0, ignore_eos=True)
    prompt = [{"role": "user", "content": "Tell me about the history of paper."}]
    if args.compile == "on":  # the same request once untimed: every bucket it meets compiles before profiling
        engine.add_request(prompt, params)
        engine.run_until_done()
        engine.block_manager.reset_prefix_cache()
    engine.add_request(prompt, params)
    for _ in range(16):  # prefill and warm-up decode steps
        engine.step()
    log = engine.add_observer(StepLog())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    step_s = sum(s.duration_s for s in log.stats) / len(log.stats)
    times: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.key.startswith(("aten::", "mkldnn::", "quantized::", "minispec::", "## Call CompiledFxGraph")):
            g = group_of(evt.key)
            times[g] = times.get(g, 0.0) + evt.self_cpu_time_total / 1e6 / args.steps
    # the profiler's own overhead inflates op times a little: shares are of the profiled step
    nbytes = weight_bytes_per_token(engine.runner.prepared, model)  # as this format stores them
    bw = bandwidth(weight_bytes(model))
    ops_s = sum(times.values())
    rows = sorted(times.items(), key=lambda kv: -kv[1])
    print(f"batch-1 decode, kernels={args.kernels}, weights={args.weights or 'float32'}, compile {args.compile}: "
          f"{1000 * step_s:.1f} ms/step = {1 / step_s:.1f} tok/s (steps timed under the profiler)")
    print(f"roofline: {nbytes / 1e6:.0f} MB of weights / {bw / 1e9:.1f} GB/s = {1000 * nbytes / bw:.1f} ms/step "
          f"({bw / nbytes:.1f} tok/s)")
    print(f"{'group':<16} {'ms/step':>8} {'share':>7}")
    for g, t in rows:
        print(f"{g:<16} {1000 * t:>8.2f} {t / step_s:>6.0%}")
    overhead = max(0.0, step_s - ops_s)
    print(f"{'python+dispatch':<16} {1000 * overhead:>8.2f} {overhead / step_s:>6.0%}")
    out = {"kernels": args.kernels, "weights": args.weights or "float32", "compile": args.compile, "step_s": step_s,
           "weight_bytes": nbytes, "bandwidth_gb_s": bw / 1e9, "roofline_step_s": nbytes / bw,
           "groups_s": dict(rows), "uncovered_s": overhead, "num_threads": torch.get_num_threads(),
           "cpu": f"{machine_name('cpu')} ({torch.backends.cpu.get_cpu_capability()}), "
                  f"{torch.get_num_threads()} threads",
           "date": time.strftime("%Y-%m-%d"), "top_ops": [
               {"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / args.steps, "calls_per_step":
                e.count / args.steps} for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]]}
    if args.rows_probe:
        out["rows_probe_ms"] = table = rows_probe(model)
        print("every projection (4 per layer), ms per pass, by rows at once:")
        for fmt, by_rows in table.items():
            print(f"  {fmt:<9} " + "  ".join(f"{m} rows {ms:5.2f}" for m, ms in by_rows.items()))
    suffix = "" if args.kernels == "fast" and not args.weights else f"_{args.kernels}_{args.weights or 'float32'}"
    suffix += "_compiled" if args.compile == "on" else ""
    path = Path(args.json) if args.json else RESULTS / f"decode_profile{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"[decode_profile] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
