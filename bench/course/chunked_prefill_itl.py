"""Chunked prefill against one-shot prefill: the decoders' inter-token latency when a long prompt arrives.

Scenario (bundled model, CPU, float32, greedy): 8 requests are decoding; once each has emitted a
few tokens, a prompt of about 2,000 tokens arrives. Without chunking the whole prompt is prefilled
in one step, and every decoder waits for that step: one gap of seconds in each of their token
streams. With chunked prefill (Agrawal et al. 2024, Sarathi-Serve) each step carries the decodes
plus a chunk that fills the rest of the token budget, so the decoders keep emitting, each gap
only one chunk long. Reported per setting: the decoders' ITL percentiles (p50, p99, max; the p99
over all their gaps, the usual serving metric), the long prompt's TTFT and the decoders' tokens/s.
Settings run alternately, in one process on the same weights, and every ratio is taken within the
run. The p99 sees the one-shot stall because each decoder has few enough gaps (``--decode-tokens``
48 gives 8 stalled gaps out of about 380, 2 %); the max ITL is printed too, as the stall itself.
This is a benchmark script, not a test.

Usage: python -m bench chunked_prefill_itl [--quick] [--budgets 256,512] [--json PATH]
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
# batch-1 decode step 1.6x slower (bench/peers/decode_profile.py, 54 against 33 ms), so it is opt-in.

import torch  # noqa: E402

from minispec.base.config import EngineConfig, SchedulerConfig
from minispec.build import build_engine
from minispec.core.support.text import chat_template_ids
from minispec.tools.summary import StepLog, percentile
from minispec.models.loader import BUNDLED_TARGET, load_model
from minispec.core.request import SamplingParams
from minispec.tools.workload import load_prompts

RESULTS = Path(__file__).resolve().parents[1] / "results"
TARGET_RATIO = 0.5  # chunked p99 ITL must be at most half of the one-shot p99 ITL
MAX_MODEL_LEN = 2304


def long_prompt(tokenizer, num_tokens: int) -> list[int]:
    """A chat-templated long document of exactly ``num_tokens`` tokens.

    Documents from data/prompts/long.jsonl are joined until they are long enough; the middle is
    cut so the prompt keeps its opening and its closing instruction and assistant header.
    """
    docs = [m[0]["content"] for m in load_prompts("long")]
    text = docs[0]
    ids = chat_template_ids(tokenizer, [{"role": "user", "content": text}])
    for doc in docs[1:]:
        if len(ids) >= num_tokens:
            break
        text += "\n\n" + doc
        ids = chat_template_ids(tokenizer, [{"role": "user", "content": text}])
    if len(ids) < num_tokens:
        raise ValueError(f"the long documents hold only {len(ids)} tokens; ask for at most that many")
    tail = 64
    return ids[: num_tokens - tail] + ids[-tail:]


def run_scenario(engine, decoder_prompts, long_ids, args) -> dict:
    """8 decoders, then the long prompt once each has ``--tokens-before`` tokens; their ITLs."""
    params = SamplingParams(max_tokens=args.decode_tokens, temperature=0.0, ignore_eos=True)
    log = engine.add_observer(StepLog())  # the scenario's steps (not the warm-up's)
    rids = [engine.add_request(ids, params) for ids in decoder_prompts]
    reqs = [engine.requests[r] for r in rids]
    start = engine.clock()
    while min(r.num_output_tokens for r in reqs) < args.tokens_before:
        engine.step()
    long_rid = engine.add_request(long_ids, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    long_req = engine.requests[long_rid]
    engine.run_until_done()
    wall = engine.clock() - start
    itl = [b - a for r in reqs for a, b in zip(r.token_times_s, r.token_times_s[1:])]
    num_tokens = sum(r.num_output_tokens for r in reqs)
    return {"itl_s": itl, "long_ttft_s": long_req.first_token_time_s - long_req.arrival_time_s,
            "decoder_tok_s": num_tokens / wall, "num_decoder_tokens": num_tokens,
            "num_steps": len(log.stats)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short smoke run (shorter prompt, fewer tokens)")
    p.add_argument("--budgets", default="256,512", help="token budgets (max_num_batched_tokens) with chunking")
    p.add_argument("--num-decoders", type=int, default=8)
    p.add_argument("--decode-tokens", type=int, default=48, help="output tokens per decoder")
    p.add_argument("--tokens-before", type=int, default=6, help="decoder tokens before the long prompt arrives")
    p.add_argument("--long-tokens", type=int, default=2000, help="long prompt length in tokens")
    p.add_argument("--repeats", type=int, default=2, help="runs per setting (settings alternate)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--kernels", choices=("fast", "reference"), default="fast", help="EngineConfig.kernels")
    p.add_argument("--json", default=None, help="output JSON (default bench/results/chunked_prefill_itl.json; "
                                                "--quick: chunked_prefill_itl_quick.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.long_tokens, args.decode_tokens, args.tokens_before, args.repeats = 600, 16, 3, 1
    budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    chats = load_prompts("chat")
    decoder_prompts = [chat_template_ids(tokenizer, chats[i % len(chats)]) for i in range(args.num_decoders)]
    long_ids = long_prompt(tokenizer, args.long_tokens)

    settings = [("one-shot", SchedulerConfig(max_num_batched_tokens=MAX_MODEL_LEN, enable_chunked_prefill=False))]
    settings += [(f"chunked {b}", SchedulerConfig(max_num_batched_tokens=b)) for b in budgets]

    def engine_for(sched):
        config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", max_model_len=MAX_MODEL_LEN,
                              kernels=args.kernels, scheduler=sched)
        engine = build_engine(config, model, tokenizer, hf_config)
        engine.add_request(decoder_prompts[0], SamplingParams(max_tokens=2, temperature=0.0))
        engine.run_until_done()  # warm-up
        return engine

    runs = {name: [] for name, _ in settings}
    for rep in range(args.repeats):
        order = settings if rep % 2 == 0 else settings[::-1]
        for name, sched in order:
            t0 = time.perf_counter()
            runs[name].append(run_scenario(engine_for(sched), decoder_prompts, long_ids, args))
            print(f"[chunked_prefill_itl] {name} run {rep + 1}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    rows = []
    for name, sched in settings:
        itl = [x for r in runs[name] for x in r["itl_s"]]
        rows.append({
            "setting": name, "enable_chunked_prefill": sched.enable_chunked_prefill,
            "max_num_batched_tokens": sched.max_num_batched_tokens, "num_itl_samples": len(itl),
            "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99), "itl_max_s": max(itl),
            "long_ttft_s": sum(r["long_ttft_s"] for r in runs[name]) / len(runs[name]),
            "decoder_tok_s": sum(r["num_decoder_tokens"] for r in runs[name])
            / sum(r["num_decoder_tokens"] / r["decoder_tok_s"] for r in runs[name]),
        })
    base = rows[0]["itl_p99_s"]
    for row in rows:
        row["p99_vs_one_shot"] = row["itl_p99_s"] / base
        row["meets_target"] = None if row is rows[0] else row["p99_vs_one_shot"] <= TARGET_RATIO

    print(f"{'setting':<12} {'budget':>6} {'ITL p50 ms':>10} {'ITL p99 ms':>10} {'ITL max ms':>10} "
          f"{'p99/one-shot':>12} {'long TTFT s':>11} {'decode tok/s':>12}")
    for r in rows:
        ok = "" if r["meets_target"] is None else ("  ok" if r["meets_target"] else "  MISSED")
        print(f"{r['setting']:<12} {r['max_num_batched_tokens']:>6} {r['itl_p50_s'] * 1e3:>10.0f} "
              f"{r['itl_p99_s'] * 1e3:>10.0f} {r['itl_max_s'] * 1e3:>10.0f} {r['p99_vs_one_shot']:>11.2f}x "
              f"{r['long_ttft_s']:>11.2f} {r['decoder_tok_s']:>12.1f}{ok}")
    result = {"machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "num_threads": torch.get_num_threads(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                          "dtype": "float32", "quick": args.quick},
              "num_decoders": args.num_decoders, "decode_tokens": args.decode_tokens,
              "tokens_before": args.tokens_before, "long_prompt_tokens": len(long_ids), "repeats": args.repeats,
              "kernels": args.kernels,
              "target_p99_ratio": TARGET_RATIO, "rows": rows}
    path = Path(args.json) if args.json else RESULTS / (
        "chunked_prefill_itl_quick.json" if args.quick else "chunked_prefill_itl.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"[chunked_prefill_itl] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
