"""Does stopping the draft where it is unsure pay? The shipped draft with and without a confidence threshold.

``SpecConfig.draft_confidence_threshold`` (``--draft-confidence-threshold``) drafts a position only
while the draft's highest probability there is at least the threshold, so a request proposes fewer
than k tokens, or none, where the draft is unsure (the stopping rule of transformers' assisted
generation, ``assistant_confidence_threshold``; EAGLE-2, Li et al. 2024, sec. 3, shows that the
draft's confidence tracks acceptance). Fewer drafts mean a narrower verify and fewer accepted tokens:
which wins depends on what a verify row costs, so it depends on the concurrency.

First, what a verify row costs: the median time of one target step with c requests of w query
rows each (w = 1 is a decode, w = k + 1 a verify at k) over one decode step, at each concurrency.
Then, for each concurrency and each setting ``k:threshold``: tokens/s over spec off measured in the same
round, mean accepted length (tokens per verify step, bonus included), tokens per generating step
(plain decodes included: a threshold turns some verify steps into plain decodes, which raises the
mean accepted length without raising the rate), drafts proposed per verify step, and whether greedy
output equals spec off's token for token. Held-out prompts, greedy, engine defaults (fast kernels).

    python -m bench draft_confidence              # prints a table, writes bench/results/draft_confidence.json
    python -m bench draft_confidence --quick      # one round, fewer prompts (a smoke test)

Run it with nothing else on the machine: every number is a ratio of runs in this process, and the
table gives the median round and the range over rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from minispec.build import build_engine  # noqa: E402
from minispec.core.block_manager import BlockManager  # noqa: E402
from minispec.base.kv_cache import KVCache  # noqa: E402
from minispec.core.model_runner import ForwardItem, ModelRunner  # noqa: E402
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig  # noqa: E402
from minispec.models.draft import load_draft  # noqa: E402
from minispec.models.loader import BUNDLED_TARGET, load_model  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.tools.workload import run_closed_loop  # noqa: E402
from draft_eval import DRAFT, route_prompts  # noqa: E402


def parse_settings(text: str) -> list[tuple[int, float]]:
    """"2:0,4:0.3" -> [(2, 0.0), (4, 0.3)]. Raises ValueError naming a malformed entry."""
    out = []
    for part in text.split(","):
        k, sep, thr = part.strip().partition(":")
        try:
            out.append((int(k), float(thr)))
        except ValueError:
            raise ValueError(f"--settings entry {part!r}: write k:threshold, e.g. 4:0.3") from None
        if not sep:
            raise ValueError(f"--settings entry {part!r}: write k:threshold, e.g. 4:0.3")
    return out


def step_times_by_width(model, concurrency: int, widths: list[int], context: int = 128, repeats: int = 15) -> dict:
    """Median seconds of one target step (fast kernels, float32) in which each of ``concurrency``
    requests, ``context`` tokens already cached, feeds w tokens and takes logits for all of them
    (a verify of k = w - 1 drafts), for each w in ``widths``."""
    cfg = model.cfg
    per_request = (context + max(widths)) // 16 + 2
    bm = BlockManager(concurrency * per_request, 16)
    kv = KVCache(cfg.num_layers, concurrency * per_request, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                 torch.device("cpu"))
    runner = ModelRunner(model, kv, bm, torch.device("cpu"), kernels="fast")
    ids = [f"r{i}" for i in range(concurrency)]
    for rid in ids:
        bm.allocate(rid, context + max(widths))
        runner.forward([ForwardItem(rid, list(range(10, 10 + context)), 0, 1)])
    out = {}
    for w in widths:
        items = [ForwardItem(rid, [42] * w, context, w) for rid in ids]
        runner.forward(items)  # warm-up: this shape's first call
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            runner.forward(items)
            times.append(time.perf_counter() - t)
        out[w] = sorted(times)[len(times) // 2]
    return out


def run_once(loaded, draft, prompts, concurrency: int, max_tokens: int, k: int = 0, threshold: float = 0.0):
    """One closed-loop run of all ``prompts`` (k 0 = spec off): its counters and greedy outputs."""
    model, tokenizer, hf_config = loaded
    gc.collect()  # the previous engine's KV cache goes before the next is built
    spec = SpecConfig(method="draft", num_speculative_tokens=k, draft_model=DRAFT,
                      draft_confidence_threshold=threshold) if k else SpecConfig()
    config = EngineConfig(model=BUNDLED_TARGET, device="cpu", dtype="float32", num_kv_blocks=400, max_model_len=512,
                          scheduler=SchedulerConfig(1024, max_num_seqs=concurrency), spec=spec)
    engine = build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config, draft=draft if k else None)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    run_closed_loop(engine, prompts[:1], 1, 1, SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    reqs, wall = run_closed_loop(engine, prompts, concurrency, len(prompts), greedy)
    return {"throughput_tok_s": sum(r.num_output_tokens for r in reqs) / wall, **generation_counts(reqs),
            "outputs": [r.output_token_ids for r in reqs]}


def generation_counts(requests) -> dict:
    """Per-step counters of finished requests: mean accepted length (tokens per verify step, bonus
    included; None without verify steps), tokens per generating step (every step that emitted a
    token: the prefill's last chunk, plain decodes and verifies), drafts proposed per verify step,
    and the share of generating steps that verified drafts."""
    out_tokens = sum(r.num_output_tokens for r in requests)
    verify_steps = sum(r.num_verify_steps for r in requests)
    verify_emitted = sum(r.num_verify_emitted for r in requests)
    # every output token not emitted by a verify step came from a one-token step (prefill or decode)
    steps = verify_steps + out_tokens - verify_emitted
    return {"mean_accepted_length": verify_emitted / verify_steps if verify_steps else None,
            "tokens_per_step": out_tokens / steps if steps else None,
            "drafts_per_verify_step": sum(r.num_draft_proposed for r in requests) / verify_steps if verify_steps else 0.0,
            "share_of_steps_verifying": verify_steps / steps if steps else 0.0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--route", default="chat", help="held-out prompts: chat, copy, json (data/prompts/) or sharegpt")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--settings", default="2:0,4:0,4:0.3,4:0.5", help="k:threshold entries; 0 = no threshold")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--widths", default="1,2,3,5,9,17", help="query rows per request for the step-cost table")
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "draft_confidence.json"))
    args = p.parse_args(argv)
    settings = parse_settings(args.settings)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.quick:
        args.rounds, args.num_prompts = 1, 4
    torch.set_num_threads(args.num_threads)
    t0 = time.time()
    loaded = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    draft = load_draft(DRAFT, loaded[0], torch.device("cpu"), torch.float32)
    prompts = route_prompts(args.route, args.num_prompts, loaded[1])
    widths = sorted({1} | {int(w) for w in args.widths.split(",")})  # w 1 (a decode) is the unit
    width_cost = []
    for c in concurrencies:
        times = step_times_by_width(loaded[0], c, widths, repeats=5 if args.quick else 15)
        width_cost += [{"concurrency": c, "rows_per_request": w, "step_s": t, "over_decode": t / times[1]}
                       for w, t in times.items()]
    print("a target step with c requests of w rows each, over a decode step (w = 1) at the same c:")
    for c in concurrencies:
        cells = [f"w {r['rows_per_request']}: {r['over_decode']:.2f}" for r in width_cost if r["concurrency"] == c]
        print(f"  c {c:>2}: " + ", ".join(cells))
    rounds = []
    for rnd in range(args.rounds):
        for c in concurrencies:
            off = run_once(loaded, draft, prompts, c, args.max_tokens)
            for k, thr in settings:
                r = run_once(loaded, draft, prompts, c, args.max_tokens, k, thr)
                row = {"round": rnd, "concurrency": c, "k": k, "threshold": thr,
                       "speedup_vs_off": r["throughput_tok_s"] / off["throughput_tok_s"],
                       "off_throughput_tok_s": off["throughput_tok_s"],
                       "identical_to_off": r.pop("outputs") == off["outputs"], **r}
                rounds.append(row)
                print(f"round {rnd} c {c} k {k} threshold {thr}: {row['speedup_vs_off']:.2f}x", file=sys.stderr)
    rows = []
    for c in concurrencies:
        for k, thr in settings:
            runs = sorted((r for r in rounds if (r["concurrency"], r["k"], r["threshold"]) == (c, k, thr)),
                          key=lambda r: r["speedup_vs_off"])
            med = runs[(len(runs) - 1) // 2]  # one round whole (the lower middle of an even count)
            rows.append({**med, "speedup_min": runs[0]["speedup_vs_off"], "speedup_max": runs[-1]["speedup_vs_off"],
                         "identical_to_off": all(r["identical_to_off"] for r in runs)})
    print(f"\n{args.route} prompts ({len(prompts)}), greedy, {args.max_tokens} new tokens, {args.rounds} round(s): "
          "speedup = tokens/s over spec off in the same round (median round, [lowest-highest])")
    print(f"{'c':>3} {'k':>2} {'threshold':>9} {'speedup':>18} {'MAL':>5} {'tok/step':>8} {'drafts/verify':>13} "
          f"{'verifying':>9} {'identical':>9}")
    for r in rows:
        mal = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        print(f"{r['concurrency']:>3} {r['k']:>2} {r['threshold']:>9.2f} "
              f"{r['speedup_vs_off']:>6.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}] {mal:>5} "
              f"{r['tokens_per_step']:>8.2f} {r['drafts_per_verify_step']:>13.2f} {r['share_of_steps_verifying']:>9.2f} "
              f"{str(r['identical_to_off']):>9}")
    meta = {"route": args.route, "num_prompts": len(prompts), "max_tokens": args.max_tokens, "rounds": args.rounds,
            "settings": args.settings, "draft": DRAFT, "platform": platform.platform(),
            "processor": platform.processor(), "torch": torch.__version__, "num_threads": args.num_threads,
            "wall_s": round(time.time() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "step_cost_by_width": width_cost, "rows": rows,
                                         "rounds": rounds}, indent=1))
    print(f"wrote {args.out} ({meta['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
