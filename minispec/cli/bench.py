"""``python -m minispec bench``: closed-loop (or Poisson) benchmark, a table for people, JSON rows for
machines.

In process, the target model is loaded once and each spec setting gets a fresh engine around it
(each draft model is loaded once too), so rows differ only in what they measure. With ``--url``
the same workloads go over HTTP to any OpenAI-compatible server (minispec/serve/client_bench.py):
the rows keep their keys, and ``--spec`` only labels what the server was started with.
See README (command line), notebooks 02 and 05, docs/production.md.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

from minispec.tools.bench import bench_rows, format_table, plot_rows, write_json
from minispec.cli.args import add_engine_args, add_structured_args, floats, ints
from minispec.cli.preflight import (check_engine_flags, check_positive, check_spec_settings, sampling_params,
                                    structured_output)
from minispec.base.config import EngineConfig, SpecConfig
from minispec.build import build_engine
from minispec.core.engine import Engine
from minispec.models.draft import load_draft
from minispec.models.loader import BUNDLED_TARGET, load_model, pick_device, pick_dtype
from minispec.core.request import SamplingParams
from minispec.serve.client_bench import merge_baseline, url_bench_rows
from minispec.build.speculation import draft_name
from minispec.tools.workload import lanes_by_share, load_prompts, parse_lanes


def add_parser(subparsers) -> None:
    """Add the ``bench`` subcommand."""
    b = subparsers.add_parser("bench", help="closed-loop (or Poisson) benchmark: table + JSON rows")
    b.add_argument("--concurrency", type=ints, default=[1, 4, 16])
    b.add_argument("--qps", type=floats, default=None, help="Poisson arrivals instead of closed loop")
    b.add_argument("--num-requests", type=int, default=16)
    b.add_argument("--max-tokens", type=int, default=32)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--ignore-eos", action="store_true", help="always generate max-tokens tokens")
    b.add_argument("--prompts", default="chat",
                   help="JSONL file, or a bundled set: chat, copy, json, long, shared (one system prompt)")
    b.add_argument("--routes", default=None, help="a mix of prompt sets, each a route, instead of --prompts: "
                   "SET:WEIGHT,... e.g. chat:3,json:1; rows then hold each route's metrics (routes)")
    b.add_argument("--opt-out", default=None, help="routes of --routes whose requests never speculate, "
                                                   "e.g. json")
    b.add_argument("--lanes", default=None, help="share of requests in the interactive lane, the rest bulk, "
                   "e.g. interactive=0.15 (with --policy lane only that lane speculates); rows then hold "
                   "each lane's metrics")
    b.add_argument("--ttft-slo", type=float, default=None, help="seconds, for goodput")
    b.add_argument("--tpot-slo", type=float, default=None, help="seconds per token, for goodput")
    b.add_argument("--repeats", type=int, default=1,
                   help="run the interleaved sweep this many times; rows give the median "
                        "speedup and its range")
    b.add_argument("--json", default=None, help="write the rows here")
    b.add_argument("--plot", default=None, help="write a PNG plot here")
    b.add_argument("--url", default=None, help="benchmark an OpenAI-compatible server instead")
    b.add_argument("--baseline", default=None, help="with --url: spec-off JSON rows to compute "
                                                    "speedups against")
    add_structured_args(b)
    add_engine_args(b)
    b.set_defaults(func=run)


def run(args) -> int:
    """Bench every --spec setting at every load level; print the table, write JSON / PNG if asked."""
    if args.url:
        return run_url(args)
    specs, prompts, params = _check_flags(args)
    traffic = _traffic(args, prompts)
    prompts = traffic.pop("prompts")
    base = check_engine_flags(args, spec="off", prefix_caching=args.prefix_caching[0])
    device = pick_device(base.device)
    make_engine = _engine_factory(base, device)
    t0 = time.perf_counter()
    rows = bench_rows(make_engine, specs, args.concurrency, args.num_requests, prompts, params,
                      qps=args.qps, ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo, repeats=args.repeats,
                      prefix_caching=args.prefix_caching, **traffic,
                      extra={"model": args.model, "device": str(device),
                             "prompts": str(args.routes or args.prompts),
                             "kernels": base.kernels, "weights": base.weights or base.dtype or "float32"})
    _report(rows, args, f"[minispec] bench took {time.perf_counter() - t0:.0f} s")
    return 0


def _check_flags(args) -> tuple[list[SpecConfig], list, SamplingParams]:
    """Every bench flag checked before anything loads: (spec settings, prompts, sampling params).
    Raises: ValueError naming the flag."""
    check_positive(args, num_requests=args.num_requests, max_tokens=args.max_tokens, qps=args.qps,
                   repeats=args.repeats, ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo)
    specs = check_spec_settings(args, args.spec, args.alpha)
    try:
        prompts = load_prompts(args.prompts)
    except ValueError as exc:
        raise ValueError(f"--prompts: {exc}") from None
    params = sampling_params(args, max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed,
                             ignore_eos=args.ignore_eos, structured=structured_output(args))
    return specs, prompts, params


def _traffic(args, prompts: list) -> dict:
    """bench_rows' traffic arguments from --lanes, --routes and --opt-out: {"prompts": one per
    request (with routes: the sets taken in turn, SET:WEIGHT requests of each), "lane_of",
    "route_of", "opt_out_routes"}. Raises: ValueError naming the flag."""
    out = {"prompts": prompts, "lane_of": None, "route_of": None,
           "opt_out_routes": tuple(r.strip() for r in (args.opt_out or "").split(",") if r.strip())}
    if args.lanes:
        try:
            out["lane_of"] = lanes_by_share(parse_lanes(args.lanes))
        except ValueError as exc:
            raise ValueError(f"--lanes: {exc}") from None
    if not args.routes:
        if out["opt_out_routes"]:
            raise ValueError("--opt-out names routes: give them with --routes, e.g. --routes chat:3,json:1")
        return out
    mix, sets = [], {}
    for part in (p.strip() for p in args.routes.split(",") if p.strip()):
        name, _, weight = part.partition(":")
        try:
            sets[name], count = load_prompts(name), int(weight or 1)
        except ValueError as exc:
            raise ValueError(f"--routes {part!r}: write SET:WEIGHT with a prompt set or JSONL file "
                             f"({exc})") from None
        if count < 1:
            raise ValueError(f"--routes {part!r}: a route's weight is a whole number >= 1")
        mix += [name] * count
    unknown = [r for r in out["opt_out_routes"] if r not in sets]
    if unknown:
        raise ValueError(f"--opt-out {','.join(unknown)}: not a route of --routes ({', '.join(sets)})")
    n = args.num_requests
    out["prompts"] = [sets[mix[i % len(mix)]][(i // len(mix)) % len(sets[mix[i % len(mix)]])]
                      for i in range(n)]
    out["route_of"] = lambda i: mix[i % len(mix)]
    return out


def _engine_factory(base: EngineConfig, device):
    """``make_engine(spec, prefix_caching)`` for bench_rows: one target model for the sweep, each draft
    loaded once."""
    dtype = pick_dtype(base.dtype, device)
    model, tokenizer, hf_config = load_model(base.model, device, dtype)
    drafts = {}

    def make_engine(spec: SpecConfig, prefix_caching: bool = base.enable_prefix_caching) -> Engine:
        draft = None
        if spec.method == "draft":
            name = draft_name(replace(base, spec=spec))
            if name not in drafts:
                drafts[name] = load_draft(name, model, device, dtype)
            draft = drafts[name]
        config = replace(base, spec=spec, enable_prefix_caching=prefix_caching)
        return build_engine(config, model, tokenizer, hf_config, draft=draft)

    return make_engine


def run_url(args) -> int:
    """``bench --url``: the same workloads against a running server; ``--spec`` labels its setting."""
    if "," in args.spec:
        raise ValueError(f"--spec {args.spec!r}: with --url, --spec only labels the server's setting; "
                         "give one")
    if len(args.prefix_caching) > 1:
        raise ValueError("--prefix-caching: with --url the server's setting holds (serve --prefix-caching); "
                         "leave the flag out")
    if args.lanes or args.routes or args.opt_out:
        raise ValueError("--lanes, --routes and --opt-out run in process (the OpenAI API has no lanes); "
                         "leave them out with --url")
    if args.json_schema or args.regex:
        raise ValueError(f"{'--json-schema' if args.json_schema else '--regex'}: runs in process; with --url "
                         "give the server's requests a response_format instead, or leave the flag out")
    _, prompts, _ = _check_flags(args)
    label = {"spec": args.spec, "k": args.k if args.spec != "off" else 0,
             "policy": args.policy if args.spec != "off" else None}
    model = None if args.model == BUNDLED_TARGET else args.model  # the default: take what the server serves
    t0 = time.perf_counter()
    rows = url_bench_rows(args.url, prompts, args.concurrency, args.num_requests, args.max_tokens,
                          temperature=args.temperature, ignore_eos=args.ignore_eos, seed=args.seed,
                          qps=args.qps, model=model, ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo,
                          label=label, api_key=os.environ.get("OPENAI_API_KEY"),
                          extra={"prompts": str(args.prompts)})
    if args.baseline:
        merge_baseline(rows, args.baseline)
    errors = sum(r["num_errors"] for r in rows)
    _report(rows, args, f"[minispec] bench --url took {time.perf_counter() - t0:.0f} s"
            + (f"; {errors} request(s) failed" if errors else ""))
    return 0


def _report(rows: list[dict], args, timing: str) -> None:
    """The table on stdout, the timing line on stderr, then the JSON and the plot if asked for."""
    print(format_table(rows))
    print(timing, file=sys.stderr)
    if args.json:
        write_json(rows, args.json)
    if args.plot:
        plot_rows(rows, args.plot)
