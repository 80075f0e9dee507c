"""Command line: ``python -m minispec generate | bench | simulate | profile | serve``.

Each subcommand parses its flags, builds configs (which validate), and calls the library; no
engine logic lives here.
"""

from __future__ import annotations

import argparse
import sys
import time

from minispec.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.spec.policy import POLICY_HELP


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 1,4,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be an integer >= 1")
    return values


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, e.g. 0.5,1,2") from None


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="smollm2-135m-instruct", help="alias, local directory or hub name")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: CUDA when present)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    g.add_argument("--packed-weights", action="store_true",
                   help="CPU speed-up: oneDNN pre-packed weights (faster verify and batched steps)")
    s = p.add_argument_group("speculation")
    s.add_argument("--spec", default="off", help="off | ngram | draft | synthetic (bench: comma-separated list)")
    s.add_argument("--k", type=int, default=4, help="draft tokens per verify step")
    s.add_argument("--draft", default=None, help="draft model for --spec draft")
    s.add_argument("--alpha", type=float, default=0.6, help="acceptance rate for --spec synthetic")
    s.add_argument("--policy", default="always", help=POLICY_HELP)


def engine_config(args, spec: str | None = None) -> EngineConfig:
    max_len = args.max_model_len
    budget = args.max_num_batched_tokens
    if args.no_chunked_prefill:
        budget = max(budget, max_len or 8192)
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, max_model_len=max_len,
        packed_weights=getattr(args, "packed_weights", False),
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=args.max_num_seqs,
                                  enable_chunked_prefill=not args.no_chunked_prefill),
        spec=SpecConfig(method=spec or args.spec, num_speculative_tokens=args.k, policy=args.policy,
                        draft_model=args.draft, alpha=args.alpha))


def cmd_generate(args) -> int:
    from minispec.engine import build_engine
    from minispec.metrics import request_metrics
    from minispec.request import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed, stop=tuple(args.stop or ()))
    engine = build_engine(engine_config(args))
    chat = args.chat if args.chat is not None else bool(getattr(engine.tokenizer, "chat_template", None))
    prompt = [{"role": "user", "content": args.prompt}] if chat else args.prompt
    rid = engine.add_request(prompt, params)
    req = engine.requests[rid]
    shown = ""
    while engine.has_unfinished():
        engine.step()
        text = engine.text(req) if req.finished else engine.tokenizer.decode(req.output_token_ids,
                                                                               skip_special_tokens=True)
        if not req.finished and text.endswith("\ufffd"):
            continue  # half of a multi-byte character: wait for the rest
        if text.startswith(shown) and len(text) > len(shown):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    m = request_metrics(req)
    tpot = f"{m['tpot_s'] * 1000:.1f} ms" if m["tpot_s"] else "-"
    line = (f"[minispec] {m['num_prompt_tokens']} prompt + {m['num_output_tokens']} output tokens, "
            f"finish={req.status.value}, TTFT {m['ttft_s'] * 1000:.0f} ms, TPOT {tpot}, "
            f"E2E {m['e2e_s']:.2f} s, {m['num_output_tokens'] / m['e2e_s']:.1f} tok/s")
    if m["acceptance_rate"] is not None:
        line += (f", spec={args.spec} k={args.k}: acceptance {m['acceptance_rate']:.2f}, "
                 f"mean accepted length {m['mean_accepted_length']:.2f}")
    if req.synthetic:
        line += " (synthetic drafter: the text is not model output)"
    print(line, file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from minispec.bench import bench_rows, format_table, plot_rows, spec_configs, write_json
    from minispec.request import SamplingParams
    from minispec.workload import load_prompts

    if args.url:
        from minispec.client_bench import run_url_bench

        return run_url_bench(args)
    from dataclasses import replace

    from minispec.engine import build_engine
    from minispec.models.loader import load_model, pick_device, pick_dtype

    specs = spec_configs(args.spec, args.k, args.policy, args.draft, args.alpha)
    prompts = load_prompts(args.prompts)
    base = engine_config(args, spec="off")
    device = pick_device(base.device)
    model, tokenizer, hf_config = load_model(base.model, device, pick_dtype(base.dtype, device))
    from minispec.models.draft import load_draft
    from minispec.spec.setup import draft_name

    dtype = pick_dtype(base.dtype, device)
    drafts = {}  # load each draft model once for the whole sweep

    def make_engine(spec):
        draft = None
        if spec.method == "draft":
            cfg = replace(base, spec=spec)
            name = draft_name(cfg)
            if name not in drafts:
                drafts[name] = load_draft(name, model, device, dtype)
            draft = drafts[name]
        return build_engine(replace(base, spec=spec), model, tokenizer, hf_config, draft=draft)

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                            ignore_eos=args.ignore_eos)
    t0 = time.perf_counter()
    rows = bench_rows(make_engine, specs, args.concurrency, args.num_requests, prompts, params,
                      qps=args.qps, ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo,
                      extra={"model": args.model, "device": str(device), "prompts": str(args.prompts)})
    print(format_table(rows))
    print(f"[minispec] bench took {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.json:
        write_json(rows, args.json)
    if args.plot:
        plot_rows(rows, args.plot)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m minispec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream one completion to stdout, stats to stderr")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false")
    add_engine_args(g)
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser("bench", help="closed-loop (or Poisson) benchmark: table + JSON rows")
    b.add_argument("--concurrency", type=_ints, default=[1, 4, 16])
    b.add_argument("--qps", type=_floats, default=None, help="Poisson arrivals instead of closed loop")
    b.add_argument("--num-requests", type=int, default=16)
    b.add_argument("--max-tokens", type=int, default=32)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--ignore-eos", action="store_true", help="always generate max-tokens tokens")
    b.add_argument("--prompts", default="chat", help="JSONL file, or a bundled set: chat, copy, json, long")
    b.add_argument("--ttft-slo", type=float, default=None, help="seconds, for goodput")
    b.add_argument("--tpot-slo", type=float, default=None, help="seconds per token, for goodput")
    b.add_argument("--json", default=None, help="write the rows here")
    b.add_argument("--plot", default=None, help="write a PNG plot here")
    b.add_argument("--url", default=None, help="benchmark an OpenAI-compatible server instead")
    b.add_argument("--baseline", default=None, help="with --url: spec-off JSON rows to compute speedups against")
    add_engine_args(b)
    b.set_defaults(func=cmd_bench)

    for name in ("simulate", "profile", "serve"):
        try:
            module = __import__(f"minispec.cli_{name}", fromlist=["register"])
        except ImportError:
            continue
        module.register(sub, add_engine_args, engine_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:
        print(f"minispec: error: {exc}", file=sys.stderr)
        return 2
