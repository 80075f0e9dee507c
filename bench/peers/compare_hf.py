"""minispec against transformers on the bundled model (CPU, float32): three same-run comparisons.

Sections (each adds rows to one table; all of them go to one JSON file):
- decode: batch-1 greedy decode, minispec against ``model.generate`` (same prompt token ids, same
  number of new tokens, EOS ignored by both). Also the memory roofline: a decode step must read
  every weight once (the LM head included, the embedding table only one row), so
  ``roofline_tok_s = stream bandwidth / weight bytes per step``, with the bandwidth measured in the
  same run as the time of a sum over a float32 tensor the size of the weights: sampled before,
  between the prompts and after (each sample the best of 3 sums), the median kept, so the roofline
  describes the same minutes the decode ran in (on a shared VM the best single sum read 42 to 76
  GB/s on the same day, and a maximum would set the roofline by the quietest instant).
- batch: 16 concurrent requests, minispec's continuous batching against transformers'
  ``model.generate_batch`` (its continuous-batching API), same prompts and max tokens.
- ngram: copy prompts at concurrency 1: minispec spec off, minispec n-gram speculation (prompt
  lookup) and ``model.generate(prompt_lookup_num_tokens=...)`` (transformers' prompt lookup),
  stopping at EOS; n-gram output must equal spec-off output token for token.
- verify: batch 1, the time of a step that verifies 4 draft tokens (5 rows) against a 1-token
  decode step, per variant: the memory-bound picture says about 1x.
minispec runs in variants KERNELS[/WEIGHTS] (minispec/models/kernels.py): "reference" (plain
``x @ W``), "fast" (oneDNN pre-packed weights, the default), and "fast/bfloat16", "fast/int8"
and "fast/int4" (PyTorch's weight-only int8 and int4 CPU kernels with bfloat16 activations; int4
is the checkpoint's own 4-bit codes: minispec/models/lowbit.py). Each variant's roofline uses the bytes its
kernels read per step.
Every ratio is measured in one run, prompt by prompt with the engines interleaved (the order
rotates), because the machine is shared and absolute numbers drift. Greedy outputs are compared
token for token; float summation order differs between the engines, so a near-tie late in a
sequence may flip, and the mismatch count is reported rather than hidden. Prompts use the chat
template, so both engines see the same token ids. This is a benchmark script, not a test.

Usage: python -m bench compare_hf [--quick] [--sections decode,batch,ngram,verify] [--variants reference,fast]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# OpenMP's own wait policy (workers spin briefly) is what the notebooks and the CLI run with, so the
# benchmarks keep it. On a machine busy with other work, OMP_WAIT_POLICY=PASSIVE stops spinning
# workers stealing the time slice of the one they wait for; on a quiet 2-core machine it made a
# batch-1 decode step 1.6x slower (bench/peers/decode_profile.py, 54 against 33 ms), so it is opt-in.

import torch  # noqa: E402

from minispec.base.config import EngineConfig, SpecConfig  # noqa: E402
from minispec.build import build_engine  # noqa: E402
from minispec.core.support.stops import eos_ids  # noqa: E402
from minispec.core.support.text import chat_template_ids  # noqa: E402
from minispec.core.support.metrics import request_metrics  # noqa: E402
from minispec.models.machine import machine_name  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, from_hf, load_hf_model, load_tokenizer, resolve_model  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.tools.workload import load_prompts  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
TARGETS = {"decode": 2.0, "batch": 4.0, "ngram_vs_off": 1.5, "ngram_vs_hf": 1.4, "roofline_fraction": 0.5,
           "int8_vs_float32": 1.3, "verify_over_decode": 1.3}
VARIANTS = ("reference", "fast", "fast/bfloat16", "fast/int8", "fast/int4", "fast+compile", "fast/int4+compile")
# bytes a step reads per stored weight, by weights format (int4: 4-bit codes, a scale and zero per 32)
BYTES_READ = {"float32": 4, "bfloat16": 2, "int8": 1, "int4": 0.625}


def variant_kernels(variant: str) -> tuple[str, str]:
    """"fast/int8" -> ("fast", "int8"); a bare kernel name keeps float32 weights; a "+compile"
    suffix (the captured CPU step, minispec/graphs/compiled_step.py) changes neither."""
    kernels, _, weights = variant.removesuffix("+compile").partition("/")
    return kernels, weights or "float32"


def weight_bytes_per_step(model) -> int:
    """Bytes a batch-1 decode step reads: every parameter but the embedding, plus one embedding row."""
    total = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if name != "embed_tokens")
    return total + model.embed_tokens[0].numel() * model.embed_tokens.element_size()


def stream_bandwidth(num_bytes: int, repeats: int = 5) -> float:
    """Read bandwidth in bytes/s: the best time of a sum over a float32 tensor of ``num_bytes``."""
    x = torch.rand(num_bytes // 4)
    x.sum()
    return num_bytes / min(timed(x.sum)[1] for _ in range(repeats))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def rotated(names: list[str], i: int) -> list[str]:
    """names with the start rotated by i, so no engine always runs first (warm caches, drift)."""
    i %= len(names)
    return names[i:] + names[:i]


def mismatches(a: list[int], b: list[int]) -> int:
    """Tokens from the first differing position to the end of the longer list (0 when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return max(len(a), len(b)) - i
    return abs(len(a) - len(b))


class Runner:
    """The bundled model over the same float32 weights: transformers' and minispec's (one model object;
    each minispec engine, plain or packed, is built on it)."""

    def __init__(self):
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # generate warns on every call about eos_token_id=-1 (EOS ignored)
        source = resolve_model(BUNDLED_TARGET)
        self.hf = load_hf_model(source).eval()
        self.tokenizer = load_tokenizer(source)
        self.eos = sorted(eos_ids(self.tokenizer, self.hf.config))
        # one model object for every variant: prepared weights (packed, int8, ...) belong to each
        # engine's ModelRunner, never to the model
        self.model = from_hf(self.hf, torch.float32, torch.device("cpu")).eval().requires_grad_(False)

    def engine(self, variant: str, spec: SpecConfig | None = None):
        kernels, weights = variant_kernels(variant)
        config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", max_model_len=2048,
                              kernels=kernels, weights=weights, compile=variant.endswith("+compile"),
                              spec=spec or SpecConfig())
        return build_engine(config, self.model, self.tokenizer, self.hf.config)

    @staticmethod
    def minispec_one(engine, ids: list[int], params: SamplingParams) -> tuple[list[int], float, dict]:
        """One request alone: (output ids, wall seconds, the request's metrics)."""
        rid = engine.add_request(ids, params)
        _, wall = timed(engine.run_until_done)
        req = engine.release(rid)
        return list(req.output_token_ids), wall, request_metrics(req)

    @torch.inference_mode()
    def hf_one(self, ids: list[int], max_new_tokens: int, ignore_eos: bool, **kwargs) -> tuple[list[int], float]:
        x = torch.tensor([ids])
        eos = -1 if ignore_eos else self.eos
        out, wall = timed(lambda: self.hf.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                                   max_new_tokens=max_new_tokens, eos_token_id=eos,
                                                   pad_token_id=self.eos[0], **kwargs))
        new = out[0, len(ids):].tolist()
        if not ignore_eos:  # generate keeps the EOS token it stopped on; so does minispec
            new = new[: next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))]
        return new, wall


def section_decode(run: Runner, args) -> dict:
    prompts = [chat_template_ids(run.tokenizer, m) for m in load_prompts("chat")[: args.num_prompts]]
    n = args.max_tokens
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    engines = {v: run.engine(v) for v in args.variants}
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for v, engine in engines.items():  # a compiled engine compiles every bucket the timed runs need first
        for ids in prompts if v.endswith("+compile") else prompts[:1]:
            run.minispec_one(engine, ids, params if v.endswith("+compile") else warm)
        engine.block_manager.reset_prefix_cache()
    run.hf_one(prompts[0], 4, ignore_eos=True)
    nbytes = weight_bytes_per_step(run.model)
    bandwidths = [stream_bandwidth(nbytes, 3)]
    wall = {who: 0.0 for who in ["hf", *engines]}
    hf_prefill_s = 0.0  # generate with one new token: its prefill, to estimate its decode-only rate
    tpots = {v: [] for v in engines}
    outs, agree = {}, {v: [0, 0] for v in engines}  # [identical outputs, mismatched tokens] vs transformers
    for i, ids in enumerate(prompts):
        for who in rotated(list(wall), i):
            if who == "hf":
                outs[who], dt = run.hf_one(ids, n, ignore_eos=True)
                hf_prefill_s += run.hf_one(ids, 1, ignore_eos=True)[1]
            else:
                outs[who], dt, metrics = run.minispec_one(engines[who], ids, params)
                tpots[who].append(metrics["tpot_s"])
            wall[who] += dt
        for v in engines:
            agree[v][0] += outs[v] == outs["hf"]
            agree[v][1] += mismatches(outs[v], outs["hf"])
        bandwidths.append(stream_bandwidth(nbytes, 3))
    num_tokens = n * len(prompts)
    bandwidth = statistics.median(bandwidths)
    roofline_tok_s = bandwidth / nbytes
    hf_decode_tok_s = (n - 1) * len(prompts) / (wall["hf"] - hf_prefill_s)
    result = {"num_prompts": len(prompts), "max_tokens": n, "hf_generate_tok_s": num_tokens / wall["hf"],
              "hf_decode_tok_s_estimate": hf_decode_tok_s,
              "weight_bytes_per_step": nbytes, "stream_bandwidth_gb_s": bandwidth / 1e9,
              "stream_bandwidth_samples_gb_s": [b / 1e9 for b in bandwidths],
              "roofline_tok_s": roofline_tok_s, "target_ratio": TARGETS["decode"], "variants": {}}
    for v in engines:
        decode_tok_s = len(tpots[v]) / sum(tpots[v])  # decode only: mean TPOT leaves the prefill out
        read = int(nbytes * BYTES_READ[variant_kernels(v)[1]] / 4)
        result["variants"][v] = {
            "tok_s": num_tokens / wall[v], "ratio": wall["hf"] / wall[v], "decode_tok_s": decode_tok_s,
            "decode_ratio_estimate": decode_tok_s / hf_decode_tok_s, "bytes_per_step": read,
            "roofline_tok_s": bandwidth / read, "roofline_fraction": decode_tok_s * read / bandwidth,
            "effective_gb_s": decode_tok_s * read / 1e9,
            "num_identical_outputs": agree[v][0], "num_mismatched_tokens": agree[v][1],
            **compile_record(engines[v])}
    if "fast" in engines:
        for v in engines:
            result["variants"][v]["decode_vs_fast_float32"] = (result["variants"][v]["decode_tok_s"]
                                                               / result["variants"]["fast"]["decode_tok_s"])
    return result


def compile_record(engine) -> dict:
    """A compiled engine's buckets and their first compile's seconds (nothing for an eager one)."""
    seconds = getattr(engine.runner, "compile_s", None)
    if seconds is None:
        return {}
    return {"compiled_buckets": len(seconds), "compile_s_total": sum(seconds.values()),
            "compile_s_max": max(seconds.values(), default=0.0), "compile_failed": engine.runner.failed}


def section_verify(run: Runner, args) -> dict:
    """Per variant, batch 1: mean time of a step verifying k = 4 drafts (all rejected, so every
    step has 5 rows) over the mean time of a plain 1-token decode step, on the same prompt."""
    from minispec.tools.summary import StepLog

    ids = chat_template_ids(run.tokenizer, load_prompts("chat")[0])
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    result = {"k": 4, "target_ratio": TARGETS["verify_over_decode"], "variants": {}}
    for v in args.variants:
        step_s = {}
        for name, spec in (("decode", None), ("verify", SpecConfig(method="synthetic", num_speculative_tokens=4,
                                                                   alpha=0.0))):
            engine = run.engine(v, spec)
            run.minispec_one(engine, ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
            log = engine.add_observer(StepLog())
            run.minispec_one(engine, ids, params)
            steps = [s.duration_s for s in log.stats if s.num_prefill_tokens == 0]
            step_s[name] = sorted(steps)[len(steps) // 2]
        result["variants"][v] = {"decode_step_s": step_s["decode"], "verify_step_s": step_s["verify"],
                                 "verify_over_decode": step_s["verify"] / step_s["decode"]}
    return result


def section_batch(run: Runner, args) -> dict:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    chats = load_prompts("chat")
    prompts = [chat_template_ids(run.tokenizer, chats[i % len(chats)]) for i in range(args.num_concurrent)]
    n = args.batch_max_tokens

    def hf_batch(m):
        gen = GenerationConfig(max_new_tokens=m, do_sample=False, eos_token_id=-1, pad_token_id=run.eos[0])
        # sized for this workload: left to itself, transformers sizes its KV cache from the free RAM
        cb = ContinuousBatchingConfig(num_blocks=args.hf_num_blocks, max_batch_tokens=args.hf_max_batch_tokens)
        with torch.inference_mode(), contextlib.redirect_stderr(io.StringIO()):
            out = run.hf.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb,
                                        progress_bar=False)
        return [list(o.generated_tokens) for o in out.values()]

    engines = {}  # one engine per variant, as in the decode section: a compiled one keeps its buckets

    def ms_batch(variant, m):
        engine = engines.get(variant) or engines.setdefault(variant, run.engine(variant))
        engine.block_manager.reset_prefix_cache()  # each run prefills as a fresh engine would
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
        rids = [engine.add_request(ids, params) for ids in prompts]  # all in flight at once
        engine.run_until_done()
        return [list(engine.requests[r].output_token_ids) for r in rids]

    def run_one(who, m):
        return hf_batch(m) if who == "hf" else ms_batch(who, m)

    names = ["hf", *args.variants]
    for who in names:  # warm-up (threads, allocator, transformers' set-up; a compiled engine's buckets)
        run_one(who, n if who.endswith("+compile") else 4)
    wall, outs = {who: 0.0 for who in names}, {}
    for rep in range(args.batch_repeats):
        for who in rotated(names, rep):
            outs[who], dt = timed(lambda: run_one(who, n))
            wall[who] += dt
    num_tokens = n * len(prompts) * args.batch_repeats
    result = {"num_requests": len(prompts), "max_tokens": n, "repeats": args.batch_repeats,
              "hf_num_blocks": args.hf_num_blocks, "hf_max_batch_tokens": args.hf_max_batch_tokens,
              "hf_generate_batch_tok_s": num_tokens / wall["hf"], "hf_num_tokens": sum(map(len, outs["hf"])),
              "target_ratio": TARGETS["batch"], "variants": {}}
    for v in args.variants:
        if any(len(o) != n for o in outs[v]):
            raise RuntimeError(f"minispec ({v}) emitted fewer than max_tokens tokens despite ignore_eos")
        result["variants"][v] = {
            "tok_s": num_tokens / wall[v], "ratio": wall["hf"] / wall[v],
            "num_identical_outputs": sum(a == b for a, b in zip(outs[v], outs["hf"])),
            "num_mismatched_tokens": sum(mismatches(a, b) for a, b in zip(outs[v], outs["hf"])),
            **compile_record(engines[v])}
    return result


def section_ngram(run: Runner, args) -> dict:
    prompts = [chat_template_ids(run.tokenizer, m) for m in load_prompts("copy")[: args.num_copy_prompts]]
    params = SamplingParams(max_tokens=args.copy_max_tokens, temperature=0.0)
    ngram = SpecConfig(method="ngram", num_speculative_tokens=args.k)
    engines = {}
    for v in args.variants:
        engines[f"{v}/off"] = run.engine(v)
        engines[f"{v}/ngram"] = run.engine(v, ngram)
    warm = SamplingParams(max_tokens=4, temperature=0.0)
    for engine in engines.values():
        run.minispec_one(engine, prompts[0], warm)
    run.hf_one(prompts[0], 4, ignore_eos=False, prompt_lookup_num_tokens=args.hf_lookup)
    names = ["hf", *engines]
    wall, tokens = {who: 0.0 for who in names}, {who: 0 for who in names}
    proposed, accepted = {v: 0 for v in args.variants}, {v: 0 for v in args.variants}
    spec_mismatch, hf_agree = {v: 0 for v in args.variants}, {v: [0, 0] for v in args.variants}
    for i, ids in enumerate(prompts):
        outs = {}
        for who in rotated(names, i):
            if who == "hf":
                outs[who], dt = run.hf_one(ids, args.copy_max_tokens, ignore_eos=False,
                                           prompt_lookup_num_tokens=args.hf_lookup)
            else:
                outs[who], dt, metrics = run.minispec_one(engines[who], ids, params)
                variant, method = who.rsplit("/", 1)  # variants may hold a "/" (fast/int8)
                if method == "ngram":
                    proposed[variant] += metrics["num_draft_proposed"]
                    accepted[variant] += metrics["num_draft_accepted"]
            wall[who] += dt
            tokens[who] += len(outs[who])
        for v in args.variants:
            spec_mismatch[v] += mismatches(outs[f"{v}/ngram"], outs[f"{v}/off"])
            hf_agree[v][0] += outs[f"{v}/off"] == outs["hf"]
            hf_agree[v][1] += mismatches(outs[f"{v}/off"], outs["hf"])
    tok_s = {who: tokens[who] / wall[who] for who in names}
    result = {"num_prompts": len(prompts), "max_tokens": args.copy_max_tokens, "k": args.k,
              "hf_prompt_lookup_num_tokens": args.hf_lookup, "hf_prompt_lookup_tok_s": tok_s["hf"],
              "num_tokens": tokens, "target_ngram_vs_off": TARGETS["ngram_vs_off"],
              "target_ngram_vs_hf": TARGETS["ngram_vs_hf"], "variants": {}}
    for v in args.variants:
        result["variants"][v] = {
            "off_tok_s": tok_s[f"{v}/off"], "ngram_tok_s": tok_s[f"{v}/ngram"],
            "ngram_vs_off": tok_s[f"{v}/ngram"] / tok_s[f"{v}/off"], "ngram_vs_hf": tok_s[f"{v}/ngram"] / tok_s["hf"],
            "acceptance_rate": accepted[v] / proposed[v] if proposed[v] else None,
            "ngram_vs_off_mismatched_tokens": spec_mismatch[v],
            "off_vs_hf_identical_outputs": hf_agree[v][0], "off_vs_hf_mismatched_tokens": hf_agree[v][1]}
    return result


def compile_line(r: dict) -> str:
    """The table's line for a compiled variant: its buckets and what their first compiles cost."""
    failed = f"; FAILED, ran eagerly: {r['compile_failed']}" if r["compile_failed"] else ""
    return (f"    compiled {r['compiled_buckets']} buckets before timing: {r['compile_s_total']:.0f} s in all, "
            f"the longest {r['compile_s_max']:.0f} s{failed}")


def table(results: dict) -> str:
    lines = [f"{'comparison':<50} {'minispec':>9} {'baseline':>9} {'ratio':>7} {'target':>7}  ok"]

    def row(name, ours, base, ratio, target):
        ok = "yes" if ratio >= target else "NO"
        lines.append(f"{name:<50} {ours:>9.1f} {base:>9.1f} {ratio:>6.2f}x {target:>6.1f}x  {ok}")

    if "decode" in results:
        d = results["decode"]
        lines.append(f"decode: {d['weight_bytes_per_step'] / 1e6:.0f} MB/step at {d['stream_bandwidth_gb_s']:.1f} GB/s "
                     f"= roofline {d['roofline_tok_s']:.1f} tok/s")
        for v, r in d["variants"].items():
            row(f"[{v}] batch-1 greedy tok/s vs generate", r["tok_s"], d["hf_generate_tok_s"], r["ratio"],
                d["target_ratio"])
            lines.append(f"    decode only {r['decode_tok_s']:.1f} tok/s = {r['roofline_fraction']:.0%} of its roofline "
                         f"{r['roofline_tok_s']:.1f} ({r['effective_gb_s']:.1f} GB/s), {r['decode_ratio_estimate']:.2f}x "
                         f"transformers' {d['hf_decode_tok_s_estimate']:.1f} (its prefill timed apart)"
                         + (f"; {r['decode_vs_fast_float32']:.2f}x fast float32" if "decode_vs_fast_float32" in r else ""))
            lines.append(f"    greedy vs transformers: {r['num_identical_outputs']}/{d['num_prompts']} identical, "
                         f"{r['num_mismatched_tokens']} tokens after a first difference")
            if "compiled_buckets" in r:
                lines.append(compile_line(r))
    if "batch" in results:
        b = results["batch"]
        for v, r in b["variants"].items():
            row(f"[{v}] {b['num_requests']} concurrent tok/s vs generate_batch", r["tok_s"],
                b["hf_generate_batch_tok_s"], r["ratio"], b["target_ratio"])
            lines.append(f"    vs transformers {r['num_identical_outputs']}/{b['num_requests']} identical, "
                         f"{r['num_mismatched_tokens']} tokens after a first difference")
            if "compiled_buckets" in r:
                lines.append(compile_line(r))
    if "verify" in results:
        f = results["verify"]
        for v, r in f["variants"].items():
            ok = "yes" if r["verify_over_decode"] <= f["target_ratio"] else "NO"
            name = f"[{v}] verify (k={f['k']}) step vs decode step, ms"
            lines.append(f"{name:<50} {1000 * r['verify_step_s']:>9.1f} {1000 * r['decode_step_s']:>9.1f} "
                         f"{r['verify_over_decode']:>6.2f}x {f['target_ratio']:>6.1f}x  {ok} (at most)")
    if "ngram" in results:
        g = results["ngram"]
        for v, r in g["variants"].items():
            row(f"[{v}] copy c=1: ngram (k={g['k']}) vs spec off", r["ngram_tok_s"], r["off_tok_s"],
                r["ngram_vs_off"], g["target_ngram_vs_off"])
            row(f"[{v}] copy c=1: ngram vs prompt_lookup_num_tokens={g['hf_prompt_lookup_num_tokens']}",
                r["ngram_tok_s"], g["hf_prompt_lookup_tok_s"], r["ngram_vs_hf"], g["target_ngram_vs_hf"])
            acc = r["acceptance_rate"]
            lines.append(f"    acceptance rate {acc if acc is None else round(acc, 2)}; ngram vs off: "
                         f"{r['ngram_vs_off_mismatched_tokens']} mismatched tokens (must be 0); off vs transformers: "
                         f"{r['off_vs_hf_identical_outputs']}/{g['num_prompts']} identical, "
                         f"{r['off_vs_hf_mismatched_tokens']} tokens after a first difference")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (few prompts, few tokens)")
    p.add_argument("--sections", default="decode,batch,ngram,verify",
                   help="comma-separated: decode, batch, ngram, verify")
    p.add_argument("--variants", default="reference,fast,fast/int4",
                   help=f"minispec variants: {', '.join(VARIANTS)}")
    p.add_argument("--json", default=None, help="output JSON (default bench/results/compare_hf.json; "
                                                "--quick: compare_hf_quick.json)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--num-prompts", type=int, default=4, help="decode: chat prompts, each run by every engine")
    p.add_argument("--max-tokens", type=int, default=128, help="decode: new tokens per prompt")
    p.add_argument("--num-concurrent", type=int, default=16, help="batch: requests in flight")
    p.add_argument("--batch-max-tokens", type=int, default=64)
    p.add_argument("--batch-repeats", type=int, default=2)
    p.add_argument("--hf-num-blocks", type=int, default=16, help="generate_batch KV pages (256 tokens each)")
    p.add_argument("--hf-max-batch-tokens", type=int, default=256, help="generate_batch token budget per step")
    p.add_argument("--num-copy-prompts", type=int, default=6)
    p.add_argument("--copy-max-tokens", type=int, default=192)
    p.add_argument("--k", type=int, default=8, help="ngram: draft tokens per verify step")
    p.add_argument("--hf-lookup", type=int, default=10, help="transformers' prompt_lookup_num_tokens")
    args = p.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if set(sections) - {"decode", "batch", "ngram", "verify"} or not sections:
        p.error(f"--sections {args.sections!r}: choose from decode, batch, ngram, verify")
    if set(args.variants) - set(VARIANTS) or not args.variants:
        p.error(f"--variants {','.join(args.variants)!r}: choose from {', '.join(VARIANTS)}")
    if args.quick:
        args.num_prompts, args.max_tokens = 2, 16
        args.batch_max_tokens, args.batch_repeats = 8, 1
        args.num_copy_prompts, args.copy_max_tokens = 2, 48
    if args.threads:
        torch.set_num_threads(args.threads)
    run = Runner()
    results = {"machine": {"platform": platform.platform(), "cpu": machine_name("cpu"),
                           "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                           "isa_restricted_to": {v: os.environ[v] for v in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
                                                 if v in os.environ},
                           "torch": torch.__version__,
                           "transformers": __import__("transformers").__version__,
                           "num_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                           "dtype": "float32", "quick": args.quick}}
    for name in sections:
        start = time.perf_counter()
        results[name] = {"decode": section_decode, "batch": section_batch, "ngram": section_ngram,
                         "verify": section_verify}[name](run, args)
        results[name]["section_wall_s"] = time.perf_counter() - start
        print(f"[compare_hf] {name} done in {results[name]['section_wall_s']:.0f} s", file=sys.stderr)
    print(table(results))
    path = Path(args.json) if args.json else RESULTS / ("compare_hf_quick.json" if args.quick else "compare_hf.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))
    print(f"[compare_hf] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
