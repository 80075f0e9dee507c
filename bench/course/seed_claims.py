"""The course's claims, each measured here with the engine and modelled on a GPU with the simulator.

One workload per claim (course/claims.py) runs on both clocks: the real engine with the
bundled SmolLM2-135M on this CPU (default fast kernels, float32, greedy; throughput runs end each
request at EOS, the neighbour and chunking runs at max_tokens, so their steps line up), and the
simulator's engine (same scheduler and policies) for Llama-3-8B with a Llama-3.2-1B draft on an
H100 and Llama-3-70B (fp8) with the same draft on an H200. Claims, in the source notes' words:
1. "A 2x tok/s demo at concurrency 1 often becomes 1.1x (or 0.9x) at concurrency 32."
2. "Quantization changes bytes per weight": float32 against int4 weights here, bf16
   against fp8 there, with and without speculation, at low and high concurrency.
3. "Draft runs on the same scarce GPU and steals more than it returns": the draft's time per
   verify step over the target's, and a costly draft that loses even at concurrency 1.
4. "Fatter steps can increase iteration time for everyone in the batch": requests that never
   speculate (bulk lane), next to plain neighbours and next to speculating ones (lane policy).
5. "Chunked prefill and speculation compose": the four combinations while a long prompt arrives.
6. "Acceptance is poor ... every batch step gets fatter for no accepts": n-gram on chat prompts
   here, alpha 0.3 there.
Prints one table (claim, measured here, modelled, the source's number) and writes
bench/results/seed_claims.json. About ten minutes on the 2-core course machine; run nothing else.

Usage: python -m bench seed_claims [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from course.claims import chunking_and_speculation, neighbours, throughput
from minispec.core.support.text import chat_template_ids
from minispec.models.draft import load_draft
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.sim import build_sim_engine
from minispec.tools.workload import load_prompts

RESULTS = Path(__file__).resolve().parents[1] / "results"
NGRAM = SpecConfig(method="ngram", num_speculative_tokens=4)
DRAFT = SpecConfig(method="draft", num_speculative_tokens=2)


def real_builder():
    """build(config) for the real engine on the bundled model (loaded once; the draft on demand)."""
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    drafts = {}

    def build(config: EngineConfig):
        draft = None
        if config.spec.method == "draft":
            if "head" not in drafts:
                drafts["head"] = load_draft("smollm2-135m-draft", model, torch.device("cpu"), torch.float32)
            draft = drafts["head"]
        return build_engine(replace(config, model=BUNDLED_TARGET, device="cpu",
                                    max_model_len=config.max_model_len or 4096),
                            model, tokenizer, hf_config, draft=draft)

    return build, tokenizer


def sim_builder(hardware: str, model: str, draft: str | None = "llama-3.2-1b", weight_dtype: str | None = None):
    """build(config) for the simulator's engine on ``hardware``."""
    def build(config: EngineConfig):
        return build_sim_engine(replace(config, max_model_len=config.max_model_len or 32768), hardware=hardware, model=model, draft=draft,
                                weight_dtype=weight_dtype)
    return build


def modelled(alpha: float, k: int = 4) -> SpecConfig:
    """Speculation in the simulator: the draft model's cost, acceptance drawn with ``alpha``."""
    return SpecConfig(method="draft", num_speculative_tokens=k, alpha=alpha)


def speedups(build, prompts, spec, concurrencies, max_tokens, min_requests, base=None) -> dict:
    """concurrency -> (tokens/s with ``spec`` over spec off, the speculating run's summary); the
    off and on runs of a concurrency are neighbours in time."""
    out = {}
    for c in concurrencies:
        n = max(min_requests, 2 * c)
        off = throughput(build, base or EngineConfig(), prompts, c, n, max_tokens)
        on = throughput(build, replace(base or EngineConfig(), spec=spec), prompts, c, n, max_tokens)
        out[c] = (on["throughput_tok_s"] / off["throughput_tok_s"], on, off)
    return out


def fmt_curve(curve: dict) -> str:
    return ", ".join(f"{v[0]:.2f}x at c={c}" for c, v in curve.items())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny workloads, numbers meaningless")
    p.add_argument("--json", default=None, help="default bench/results/seed_claims[_quick].json")
    args = p.parse_args(argv)
    q = args.quick
    start = time.perf_counter()
    build, tokenizer = real_builder()
    copy = [chat_template_ids(tokenizer, m) for m in load_prompts("copy")]
    chat = [chat_template_ids(tokenizer, m) for m in load_prompts("chat")]
    long_doc = chat_template_ids(tokenizer, load_prompts("long")[0])[: 300 if q else 1500]
    gpu_prompt = [[0] * 512]
    h100 = sim_builder("h100", "llama-3-8b")
    hi = [1, 2] if q else [1, 32]
    tok, n_min = (8, 2) if q else (48, 8)
    sim_tok, sim_n = (32, 64) if q else (128, 256)
    claims, log = [], lambda msg: print(f"[seed_claims] {msg} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)

    def sim_speedups(build_sim, spec, concurrencies, base=None):
        return speedups(build_sim, gpu_prompt, spec, concurrencies, sim_tok, sim_n, base)

    # 1. the crossover
    ngram_copy = speedups(build, copy, NGRAM, hi, tok, n_min)
    draft_chat = speedups(build, chat, DRAFT, hi, tok, n_min)
    m8 = sim_speedups(h100, modelled(0.8), [1, 32, 128])
    m70 = sim_speedups(sim_builder("h200", "llama-3-70b", weight_dtype="fp8"), modelled(0.8), [1, 32, 128])
    claims.append({"claim": "2x at concurrency 1 becomes 1.1x (or 0.9x) at 32",
                   "measured": f"n-gram k4, copy prompts: {fmt_curve(ngram_copy)}; shipped draft k2, chat: "
                               f"{fmt_curve(draft_chat)}",
                   "modelled": f"8B + 1B draft, H100, alpha 0.8, k4: {fmt_curve(m8)}; 70B fp8 + 1B, H200: {fmt_curve(m70)}",
                   "source": "2x -> 1.1x (or 0.9x) at 32"})
    log("crossover")

    # 2. quantization, batching and speculation share one budget
    quant = {}
    for weights in ("float32", "int4"):
        base = EngineConfig(weights=weights)
        quant[weights] = speedups(build, copy, NGRAM, hi, tok, n_min, base)
    mq = {dtype: sim_speedups(sim_builder("h100", "llama-3-8b", weight_dtype=dtype), modelled(0.8),
                              [1, 32, 128]) for dtype in ("bfloat16", "fp8")}

    def quant_text(curves, lo, hi_c):
        return "; ".join(f"{w}: off {v[lo][2]['throughput_tok_s']:.0f} -> {v[hi_c][2]['throughput_tok_s']:.0f} tok/s, "
                         f"speculation {v[lo][0]:.2f}x -> {v[hi_c][0]:.2f}x" for w, v in curves.items())
    claims.append({"claim": "quantization changes bytes per weight; it, batching and speculation share one budget",
                   "measured": f"c={hi[0]} -> c={hi[-1]}, n-gram k4 on copy prompts: " + quant_text(quant, hi[0], hi[-1]),
                   "modelled": "8B + 1B, H100, alpha 0.8, c=1 -> c=128: " + quant_text(mq, 1, 128),
                   "source": "(no number)"})
    log("quantization")

    # 3. the draft steals the device
    d1 = draft_chat[hi[0]][1]
    cheap = sim_speedups(h100, modelled(0.6), [1])
    costly_build = sim_builder("h100", "llama-3-8b", draft="llama-3.1-8b")
    costly = sim_speedups(costly_build, modelled(0.6), [1])
    small = sim_speedups(sim_builder("h100", "llama-3-8b", draft="qwen2.5-0.5b"), modelled(0.6), [1])
    claims.append({"claim": "a draft on the same device can steal more than it returns",
                   "measured": f"shipped draft, chat, c={hi[0]}: draft time {d1['draft_time_share']:.2f} of the target's "
                               f"per verify step, acceptance rate {d1['acceptance_rate']:.2f}, "
                               f"{draft_chat[hi[0]][0]:.2f}x spec off",
                   "modelled": "8B target, H100, alpha 0.6, k4, c=1: " + "; ".join(
                       f"{name} draft: draft time {v[1][1]['draft_time_share']:.2f} of the target's, {v[1][0]:.2f}x"
                       for name, v in (("0.5B", small), ("1B", cheap), ("8B", costly))),
                   "source": "(no number)"})
    log("draft cost")

    # 4. fat verify steps slow neighbours that do not speculate
    # the interactive requests outlast the bulk ones, so every bulk step has speculating neighbours
    nb_here = neighbours(build, EngineConfig(spec=NGRAM), copy, 2 if q else 4, 2 if q else 4, tok,
                         interactive_max_tokens=3 * tok)
    nb_gpu = neighbours(h100, EngineConfig(spec=modelled(0.8),
                                           scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256)),
                        gpu_prompt, 64, 64, sim_tok, interactive_max_tokens=4 * sim_tok)

    def nb_text(r):
        a, b = r["plain"]["bulk"], r["speculating"]["bulk"]
        return (f"bulk lane TPOT {1000 * a['tpot_p50_s']:.1f} -> {1000 * b['tpot_p50_s']:.1f} ms "
                f"({b['tpot_p50_s'] / a['tpot_p50_s']:.2f}x), p99 ITL {1000 * a['itl_p99_s']:.1f} -> "
                f"{1000 * b['itl_p99_s']:.1f} ms; interactive TPOT {1000 * r['plain']['interactive']['tpot_p50_s']:.1f}"
                f" -> {1000 * r['speculating']['interactive']['tpot_p50_s']:.1f} ms")
    claims.append({"claim": "fatter verify steps raise iteration time for everyone in the batch",
                   "measured": f"{'2 + 2' if q else '4 + 4'} copy requests (interactive ones 3x longer), n-gram k4 on the "
                               "interactive lane only: "
                               + nb_text(nb_here),
                   "modelled": "64 + 64 requests (interactive ones 4x longer), 8B + 1B, H100, alpha 0.8, interactive "
                               "lane only: " + nb_text(nb_gpu),
                   "source": "(no number)"})
    log("neighbours")

    # 5. chunked prefill composes with speculation
    cs_here = chunking_and_speculation(build, EngineConfig(spec=NGRAM), copy[:4], long_doc, 128 if q else 256, tok)
    cs_gpu = chunking_and_speculation(h100, EngineConfig(spec=modelled(0.8)), gpu_prompt * 32,
                                      [0] * 16000, 1024, sim_tok)

    def cs_text(r):
        names = {(False, False): "neither", (True, False): "chunking", (False, True): "speculation",
                 (True, True): "both"}
        return "; ".join(f"{names[key]}: TPOT {1000 * v['tpot_p50_s']:.1f} ms, worst ITL {1000 * v['itl_max_s']:.0f} ms"
                         for key, v in r.items())
    claims.append({"claim": "chunked prefill and speculation compose",
                   "measured": f"4 copy decoders + a {len(long_doc)}-token prompt, budget {128 if q else 256}: "
                               + cs_text(cs_here),
                   "modelled": "32 decoders + a 16,000-token prompt, budget 1024, 8B + 1B, H100: " + cs_text(cs_gpu),
                   "source": "chunking protects TPOT from long prompts; speculation speeds the decode tokens that follow"})
    log("chunking")

    # 6. poor acceptance
    poor = speedups(build, chat, NGRAM, hi, tok, n_min)
    m3 = sim_speedups(h100, modelled(0.3), [1, 32])
    claims.append({"claim": "poor acceptance makes every step fatter for no gain",
                   "measured": f"n-gram k4 on chat prompts (acceptance rate {poor[hi[0]][1]['acceptance_rate']:.2f}): "
                               f"{fmt_curve(poor)}; mean step {1000 * poor[hi[0]][2]['mean_step_s']:.0f} -> "
                               f"{1000 * poor[hi[0]][1]['mean_step_s']:.0f} ms at c={hi[0]}",
                   "modelled": f"8B + 1B, H100, alpha 0.3, k4: {fmt_curve(m3)}",
                   "source": "(no number)"})
    log("poor acceptance")

    for c in claims:
        print(f"\n## {c['claim']}\n  measured here: {c['measured']}\n  modelled:      {c['modelled']}\n"
              f"  the source:    {c['source']}")
    machine = {"platform": platform.platform(), "torch": torch.__version__, "num_threads": torch.get_num_threads(),
               "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "quick": q,
               "wall_s": time.perf_counter() - start}
    path = Path(args.json) if args.json else RESULTS / ("seed_claims_quick.json" if q else "seed_claims.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "claims": claims}, indent=1))
    print(f"[seed_claims] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
