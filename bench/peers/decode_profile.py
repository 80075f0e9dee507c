"""Where a batch-1 decode step's time goes: a per-op profile against the memory roofline.

Runs batch-1 greedy decode of the bundled model on the engine's default settings (or the kernels
and weights given), profiles a window of decode steps with torch.profiler, and groups the CPU time
of every op by what it does: the weight matmuls (the part the roofline counts), the LM head,
attention (paged gather, masks, SDPA, KV writes), norms, rotary, sampling, and the rest; the step
wall time not covered by any op is Python and dispatch overhead. Prints a table and writes JSON.
The roofline: a decode step must read every weight once, so at the stream bandwidth measured in the
same run (a sum over a float32 tensor the size of the weights) it takes bytes / bandwidth.
A benchmark script, not a test.

``--compile-probe`` also times one decoder layer of the engine (its own prepared weights, attention
replaced by a stand-in that returns the queries, so what is timed is everything else in the layer)
eagerly and under ``torch.compile`` (inductor), at 1 and 5 rows: whether compiling the per-layer
work outside attention would pay on this CPU. With ``--weights int4`` it then runs the whole engine
that way (``compile_engine_probe``): each layer split around its paged attention, the halves
eager and compiled, in interleaved rounds of batch-1 decode against the engine's own forward.

Usage: python -m bench decode_profile [--kernels fast|reference] [--weights float32|bfloat16|int8|int4]
       [--compile-probe] [--rows-probe]
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
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from minispec.build import build_engine
from minispec.base.config import EngineConfig
from minispec.tools.summary import StepLog
from minispec.core.attention import paged_attention, write_kv
from minispec.models import lowbit
from minispec.models.kernels import PROJECTIONS, linear, prepare_weights, release_weights, weight_bytes_per_token
from minispec.models.llama import apply_rope, rms_norm
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.core.request import SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results"
GROUPS = (  # (group, substrings of op names), first match wins
    ("matmul", ("mkldnn", "bmm", "mm", "linear", "addmm", "quantized")),
    ("attention", ("scaled_dot_product", "attention", "index_select", "index_copy", "index_put", "masked", "where",
                   "gather", "softmax")),
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


def compile_probe(model, prepared, repeats: int = 300) -> dict:
    """Microseconds per call of layer 0 (stand-in attention) eager and compiled, at 1 and 5 rows;
    the compile's own seconds. Both paths run the same prepared weights."""
    layer, cfg = model.layers[0], model.cfg
    weights = prepared.layers[0] if prepared else None

    def attend(q, k, v):  # stand-in: [N, H, D] of the right shape, no attention
        return q

    def run(x, cos, sin):
        return layer(x, cos, sin, attend, weights)

    def per_call_us(fn, *args) -> float:
        for _ in range(20):
            fn(*args)
        start = time.perf_counter()
        for _ in range(repeats):
            fn(*args)
        return (time.perf_counter() - start) / repeats * 1e6

    out = {}
    with torch.inference_mode():
        start = time.perf_counter()
        compiled = torch.compile(run, dynamic=False)
        for rows in (1, 5):
            x = torch.randn(rows, cfg.hidden_size)
            cos, sin = model.rope(torch.arange(rows))
            compiled(x, cos, sin)
        out["compile_s"] = time.perf_counter() - start
        for rows in (1, 5):
            x = torch.randn(rows, cfg.hidden_size)
            cos, sin = model.rope(torch.arange(rows))
            out[f"eager_us_{rows}"] = per_call_us(run, x, cos, sin)
            out[f"compiled_us_{rows}"] = per_call_us(compiled, x, cos, sin)
    return out


def _int4_halves(prepared_layer: dict, layer, cfg) -> tuple:
    """Layer ``layer``'s int4 weights and norms as plain tensors, in the halves' argument order."""
    w = {name: prepared_layer[name].weight for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
    return ((layer.input_norm, w["qkv_proj"].packed, w["qkv_proj"].scale_zero),
            (w["o_proj"].packed, w["o_proj"].scale_zero, layer.post_norm, w["gate_up_proj"].packed,
             w["gate_up_proj"].scale_zero, w["down_proj"].packed, w["down_proj"].scale_zero))


def _before_attention(x, norm, qkv_packed, qkv_sz, cos, sin, eps: float, h: int, hkv: int, d: int):
    """A decoder layer up to attention, int4 weights as plain tensor arguments (one graph serves
    every layer): the same ops as DecoderLayer.forward."""
    qkv = lowbit.int4_linear(rms_norm(x, norm, eps), lowbit.Int4Weight(qkv_packed, qkv_sz, (0, 0)))
    qk, v = qkv.split([(h + hkv) * d, hkv * d], dim=-1)
    q, k = apply_rope(qk.unflatten(-1, (h + hkv, d)), cos, sin).split([h, hkv], dim=-2)
    return q, k, v.unflatten(-1, (hkv, d))


def _after_attention(x, o, o_packed, o_sz, norm, gu_packed, gu_sz, down_packed, down_sz, eps: float):
    """The rest of the layer: output projection, residual, norm, SwiGLU MLP, residual."""
    x = x + lowbit.int4_linear(o.flatten(-2), lowbit.Int4Weight(o_packed, o_sz, (0, 0)))
    gate, up = lowbit.int4_linear(rms_norm(x, norm, eps), lowbit.Int4Weight(gu_packed, gu_sz, (0, 0))).chunk(2, -1)
    return x + lowbit.int4_linear(F.silu(gate) * up, lowbit.Int4Weight(down_packed, down_sz, (0, 0)))


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


def compile_engine_probe(engine, model, rounds: int = 5, max_tokens: int = 64) -> dict:
    """Batch-1 greedy decode on the int4 engine with each layer split around its paged attention,
    the two halves run eagerly and under ``torch.compile`` (inductor, static shapes), against the
    engine's own forward: interleaved rounds of three chat prompts, median tok/s per variant, and
    whether each variant's tokens equal the engine's."""
    runner, cfg = engine.runner, model.cfg
    dims = dict(eps=cfg.rms_norm_eps)

    def split_forward(before, after):
        def run_model(input_ids, positions, meta, **extra):
            kv = runner.kv_cache
            x = F.embedding(input_ids, model.embed_tokens)
            cos, sin = model.rope(positions)
            for i, layer in enumerate(model.layers):
                first, second = _int4_halves(runner.prepared.layers[i], layer, cfg)
                q, k, v = before(x, *first, cos, sin, cfg.rms_norm_eps, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
                write_kv(k, v, kv.k[i], kv.v[i], meta.slot_mapping)
                x = after(x, paged_attention(q, kv.k[i], kv.v[i], meta, model.scale), *second, **dims)
            return rms_norm(x, model.norm, cfg.rms_norm_eps)
        return run_model

    start = time.perf_counter()
    variants = {"engine": runner.run_model, "split, eager": split_forward(_before_attention, _after_attention),
                "split, compiled": split_forward(torch.compile(_before_attention, dynamic=False),
                                                 torch.compile(_after_attention, dynamic=False))}
    prompts = ["Tell me about the history of paper.", "Write a short poem about the sea.",
               "Explain photosynthesis simply."]

    def generate(prompt: str, n: int) -> list[int]:
        engine.add_request([{"role": "user", "content": prompt}], SamplingParams(max_tokens=n, temperature=0.0,
                                                                                  ignore_eos=True))
        return list(engine.run_until_done()[0].output_token_ids)

    for fn in variants.values():  # warm-up: the compile, and one prefill length besides the prompts'
        runner.run_model = fn
        generate("hi", 4)
    warmup_s = time.perf_counter() - start
    names, tok_s, tokens = list(variants), {v: [] for v in variants}, {v: [] for v in variants}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runner.run_model = variants[name]
            t = time.perf_counter()
            out = [generate(p, max_tokens) for p in prompts]
            tok_s[name].append(len(prompts) * max_tokens / (time.perf_counter() - t))
            tokens[name] = tokens[name] or out
    runner.run_model = variants["engine"]
    base = statistics.median(tok_s["engine"])
    return {"rounds": rounds, "warmup_s": warmup_s, "variants": {
        name: {"median_tok_s": statistics.median(v), "vs_engine": statistics.median(v) / base, "rounds_tok_s": v,
               "same_tokens_as_engine": tokens[name] == tokens["engine"]} for name, v in tok_s.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="fast", choices=("fast", "reference"))
    p.add_argument("--weights", default=None)
    p.add_argument("--steps", type=int, default=32, help="decode steps profiled")
    p.add_argument("--compile-probe", action="store_true", help="also time one layer eager vs torch.compile")
    p.add_argument("--rows-probe", action="store_true",
                   help="also time every projection per weight format at 1 to 9 rows (the ridge per format)")
    p.add_argument("--json", default=None, help="default bench/results/decode_profile[_KERNELS_WEIGHTS].json")
    args = p.parse_args(argv)
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    config = EngineConfig(model=BUNDLED_TARGET, device="cpu", kernels=args.kernels, weights=args.weights)
    engine = build_engine(config, model, tokenizer, hf_config)
    params = SamplingParams(max_tokens=args.steps + 24, temperature=0.0, ignore_eos=True)
    engine.add_request([{"role": "user", "content": "Tell me about the history of paper."}], params)
    for _ in range(16):  # prefill and warm-up decode steps
        engine.step()
    log = engine.add_observer(StepLog())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            engine.step()
    step_s = sum(s.duration_s for s in log.stats) / len(log.stats)
    times: dict[str, float] = {}
    for evt in prof.key_averages():
        if evt.key.startswith("aten::") or evt.key.startswith("mkldnn::") or evt.key.startswith("quantized::"):
            g = group_of(evt.key)
            times[g] = times.get(g, 0.0) + evt.self_cpu_time_total / 1e6 / args.steps
    # the profiler's own overhead inflates op times a little: shares are of the profiled step
    nbytes = weight_bytes_per_token(engine.runner.prepared, model)  # as this format stores them
    bw = bandwidth(weight_bytes(model))
    ops_s = sum(times.values())
    rows = sorted(times.items(), key=lambda kv: -kv[1])
    print(f"batch-1 decode, kernels={args.kernels}, weights={args.weights or 'float32'}: "
          f"{1000 * step_s:.1f} ms/step = {1 / step_s:.1f} tok/s (steps timed under the profiler)")
    print(f"roofline: {nbytes / 1e6:.0f} MB of weights / {bw / 1e9:.1f} GB/s = {1000 * nbytes / bw:.1f} ms/step "
          f"({bw / nbytes:.1f} tok/s)")
    print(f"{'group':<16} {'ms/step':>8} {'share':>7}")
    for g, t in rows:
        print(f"{g:<16} {1000 * t:>8.2f} {t / step_s:>6.0%}")
    overhead = max(0.0, step_s - ops_s)
    print(f"{'python+dispatch':<16} {1000 * overhead:>8.2f} {overhead / step_s:>6.0%}")
    out = {"kernels": args.kernels, "weights": args.weights or "float32", "step_s": step_s,
           "weight_bytes": nbytes, "bandwidth_gb_s": bw / 1e9, "roofline_step_s": nbytes / bw,
           "groups_s": dict(rows), "uncovered_s": overhead, "num_threads": torch.get_num_threads(),
           "date": time.strftime("%Y-%m-%d"), "top_ops": [
               {"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / args.steps, "calls_per_step":
                e.count / args.steps} for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:15]]}
    if args.compile_probe:
        out["compile_probe"] = probe = compile_probe(model, engine.runner.prepared)
        print(f"one layer without attention: eager {probe['eager_us_1']:.0f} us (1 row), {probe['eager_us_5']:.0f} us "
              f"(5 rows); torch.compile {probe['compiled_us_1']:.0f} / {probe['compiled_us_5']:.0f} us "
              f"(compiled in {probe['compile_s']:.0f} s)")
        if out["weights"] == "int4":  # inductor traces the int4 kernel; oneDNN's packed float32 weights it cannot
            out["compile_engine_probe"] = whole = compile_engine_probe(engine, model)
            for name, v in whole["variants"].items():
                print(f"decode, {name}: median {v['median_tok_s']:.1f} tok/s ({v['vs_engine']:.2f}x the engine's "
                      f"own forward), same tokens: {v['same_tokens_as_engine']}")
    if args.rows_probe:
        out["rows_probe_ms"] = table = rows_probe(model)
        print("every projection (4 per layer), ms per pass, by rows at once:")
        for fmt, by_rows in table.items():
            print(f"  {fmt:<9} " + "  ".join(f"{m} rows {ms:5.2f}" for m, ms in by_rows.items()))
    suffix = "" if args.kernels == "fast" and not args.weights else f"_{args.kernels}_{args.weights or 'float32'}"
    path = Path(args.json) if args.json else RESULTS / f"decode_profile{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"[decode_profile] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
