"""``python -m minispec simulate``: bench's table and JSON rows from the simulator.

Same flags as bench where they mean the same thing, checked by the same preflight before anything is simulated
(minispec/cli/preflight.py: an error names its flag), plus the hardware, the model shapes and how acceptance
is drawn. The engine mode, CUDA graphs or not, is the hardware's: ``--hardware NAME@MODE`` or
``--engine-mode`` (``--cuda-graphs`` is refused by name). The simulator runs the real scheduler on a virtual
clock, so the rows have bench's keys. Prefix caching is off unless ``--prefix-caching`` says otherwise: the
default prompts are placeholders of one token id; ``--prompts shared --prefix-caching off,on`` models a shared
system prompt with real token ids. Examples (the course's production-scale question, notebook 05;
docs/cost_model.md):
    python -m minispec simulate --hardware h100 --model llama-3-8b --draft llama-3.2-1b \
        --alpha 0.8 --k 4 --concurrency 1,2,4,8,16,32,64,128
    python -m minispec simulate --hardware h100@sglang-0.5-cuda-graphs --model llama-3.1-8b \
        --draft eagle3-head --k 3 --acceptance-length 2.4
    python -m minispec simulate --draft eagle-head --alpha 0.8 --concurrency 32 --policy lane \
        --lanes interactive=0.15 --json lanes.json      # a premium lane: each lane's metrics per row
"""

from __future__ import annotations

import sys
import time

from minispec.tools.bench import format_table, plot_rows, write_json
from minispec.cli.args import add_engine_args, floats, ints
from minispec.cli.preflight import check_engine_flags, check_positive, check_spec_settings
from minispec.base.config import EngineConfig, SpecConfig
from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model
from minispec.speculation.acceptance import (FixedAlpha, RouteAlpha, alpha_for_accepted_length, load_trace,
                                      parse_routes)
from minispec.cost.hardware import HardwareSpec, load_hardware
from minispec.cost.modelspec import DTYPE_BYTES
from minispec.sim.route_alpha import MEASURED, resolve_measured_routes
from minispec.sim.sweep import route_prompts, routes_in_turn, sim_rows
from minispec.base.tree_shape import canonical_tree
from minispec.tools.workload import lanes_by_share, load_prompts, parse_lanes

# prefix caching off: the default prompts are placeholders of one id, which would share every block
SIM_DEFAULTS = dict(model="llama-3-8b", spec=None, max_num_batched_tokens=8192, max_num_seqs=256,
                    prefix_caching=[False])


def add_parser(subparsers) -> None:
    """Add the ``simulate`` subcommand; its engine-flag defaults are production-sized (SIM_DEFAULTS)."""
    p = subparsers.add_parser("simulate",
                              help="bench on a virtual clock: any hardware, model and concurrency")
    p.add_argument("--hardware", default="h100", help="name in data/hardware/ (h100, h200, b200, a100-80gb, "
                   "a40, l40s, l4, rtx3090, rtx4090, mi300x, this, ...) or a JSON file; NAME@MODE picks an "
                   "engine mode, the measured overheads of one engine, CUDA graphs or not (e.g. "
                   "h100@sglang-0.5-cuda-graphs, h100@megakernel): the simulator's CUDA graphs "
                   "are chosen here")
    p.add_argument("--engine-mode", default=None, help="the engine whose measured overheads to use (the "
                   "hardware file's engine_modes, e.g. megakernel); default: the file's own")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="GPUs the target and drafter are split over")
    p.add_argument("--acceptance-length", type=float, default=None,
                   help="mean accepted length per verify (bonus included) at --k; alpha is solved from it")
    p.add_argument("--concurrency", type=ints, default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--qps", type=floats, default=None, help="Poisson arrivals instead of closed loop")
    p.add_argument("--num-requests", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=128, help="output tokens per request (EOS ignored)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per request")
    p.add_argument("--prompts", default=None, help="take prompts from a prompt set (chat, copy, json, long, "
                   "shared or a JSONL file), tokenized with the bundled tokenizer; overrides --prompt-len")
    p.add_argument("--routes", default=None, help="alpha per route with a mix, e.g. chat=0.8:3,json=0.3:1; "
                   "rows then hold each route's metrics (routes); json=measured:1 reads the JSON route's "
                   "alpha as bench/course/json_routes.py measured it (bench/results/json_routes.json, "
                   "grammar + jump-forward)")
    p.add_argument("--opt-out", default=None, help="routes whose requests never speculate "
                   "(num_speculative_tokens=0), e.g. json")
    p.add_argument("--lanes", default=None, help="share of requests in the interactive lane, the rest bulk, "
                   "e.g. interactive=0.15 (with --policy lane only that lane speculates); rows then hold "
                   "each lane's metrics")
    p.add_argument("--acceptance-trace", default=None, help="JSON of per-position acceptance from a real run")
    p.add_argument("--weight-dtype", default=None, choices=list(DTYPE_BYTES),
                   help="bytes per weight (default: the hardware's dtype); fp8 / int4 model quantization")
    p.add_argument("--kv-dtype", default=None, choices=list(DTYPE_BYTES),
                   help="KV cache dtype (default: weights')")
    p.add_argument("--draft-kv-window", type=int, default=None,
                   help="the draft attends to at most this many recent tokens (MagicDec-style "
                        "sparse draft KV)")
    p.add_argument("--memory-utilization", type=float, default=0.9, help="fraction of device memory to use")
    p.add_argument("--ttft-slo", type=float, default=None, help="seconds, for goodput")
    p.add_argument("--tpot-slo", type=float, default=None, help="seconds per token, for goodput")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    add_engine_args(p, simulated=True)
    p.set_defaults(func=run, **SIM_DEFAULTS)


def run(args) -> int:
    """Simulate every --spec setting at every load level; print the table, write JSON / PNG if asked."""
    config, specs, alpha, hardware = _check_flags(args)
    prompts, tokenizer = _prompts(args)
    lane_of, route_of, opt_out = _traffic(args)
    t0 = time.perf_counter()
    rows = sim_rows(config, specs, args.concurrency,
                    args.num_requests, prompts, args.max_tokens, hardware=hardware, model=args.model,
                    draft=args.draft,
                    acceptance_factory=_acceptance_factory(args), qps=args.qps, ttft_slo_s=args.ttft_slo,
                    tpot_slo_s=args.tpot_slo, weight_dtype=args.weight_dtype or args.dtype,
                    kv_dtype=args.kv_dtype, draft_kv_window=args.draft_kv_window,
                    memory_utilization=args.memory_utilization, tokenizer=tokenizer,
                    prefix_caching=args.prefix_caching,
                    tensor_parallel_size=args.tensor_parallel_size, lane_of=lane_of, route_of=route_of,
                    opt_out_routes=opt_out)
    first = rows[0]
    tp = f" x {args.tensor_parallel_size}" if args.tensor_parallel_size > 1 else ""
    print(f"simulated: {first['model']} ({first['weight_dtype']}) on {first['hardware']}{tp} "
          f"({first['engine_mode']})" + (f", draft {args.draft}" if any(s.method == "draft" for s in specs)
                                         else "")
          + (f", routes {args.routes}" if args.routes else
             f", alpha {alpha:.3f}" if any(s.enabled for s in specs) and not args.acceptance_trace else ""))
    print(format_table(rows))
    print(f"[minispec] simulate took {time.perf_counter() - t0:.1f} s (virtual time is in the table)",
          file=sys.stderr)
    if args.json:
        write_json(rows, args.json)
    if args.plot:
        plot_rows(rows, args.plot, title=f"Simulated {first['model']} on {first['hardware']}: "
                  "speculation against batching")
    return 0


def _check_flags(args) -> tuple[EngineConfig, list[SpecConfig], float, HardwareSpec]:
    """Every simulate flag checked before anything is simulated, by bench's and generate's preflight
    where the flags are theirs: (the engine config, the spec settings, alpha, the hardware).
    Raises: ValueError naming the flag."""
    check_positive(args, num_requests=args.num_requests, max_tokens=args.max_tokens,
                   prompt_len=args.prompt_len, qps=args.qps, ttft_slo=args.ttft_slo, tpot_slo=args.tpot_slo,
                   tensor_parallel_size=args.tensor_parallel_size, draft_kv_window=args.draft_kv_window)
    if args.draft_confidence_threshold:
        raise ValueError(f"--draft-confidence-threshold {args.draft_confidence_threshold}: the simulator "
                         "draws acceptance from an acceptance model and has no draft probabilities to "
                         "compare with a threshold; leave it at 0 (measure it with minispec bench)")
    config = check_engine_flags(args, spec="off", prefix_caching=False, simulated=True)
    if args.routes and MEASURED in args.routes:
        try:
            args.routes = resolve_measured_routes(args.routes, _measured_drafter(args))
        except ValueError as exc:
            raise ValueError(f"--routes: {exc}") from None
    alpha = _alpha(args)
    specs = check_spec_settings(args, args.spec or ("off,draft" if args.draft else "off,synthetic"), alpha)
    for flag, value, parse in (("--lanes", args.lanes, parse_lanes), ("--routes", args.routes, parse_routes)):
        if value:
            try:
                parse(value)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from None
    try:
        hardware = load_hardware(args.hardware, args.engine_mode)
    except ValueError as exc:
        raise ValueError(f"{'--engine-mode' if args.engine_mode else '--hardware'}: {exc}") from None
    return config, specs, alpha, hardware


def _measured_drafter(args) -> str:
    """The row of bench/course/json_routes.py's run that a ``json=measured`` route reads: n-gram lookup
    when --spec speculates only by n-gram or --draft is ngram, else the shipped draft (an EAGLE
    head, standing in for any draft model or head); a tree (--draft-topk above 1) reads the tree row."""
    methods = {m.strip() for m in (args.spec or "").split(",")} - {"off", ""}
    drafter = "ngram" if methods == {"ngram"} or args.draft == "ngram" else "eagle"
    return drafter + ("-tree" if args.draft_topk > 1 else "")


def _alpha(args) -> float:
    """--alpha, or the alpha whose mean accepted length at --k (or the --draft-topk tree) is
    --acceptance-length."""
    if args.acceptance_length is None:
        return args.alpha
    if args.acceptance_trace or args.routes:
        raise ValueError("--acceptance-length with --acceptance-trace or --routes: "
                         "give one way to set acceptance")
    try:
        tree = (canonical_tree(args.k, args.draft_topk, args.num_draft_tokens or args.k)
                if args.draft_topk > 1 else None)
        return alpha_for_accepted_length(args.acceptance_length, args.k, tree)
    except ValueError as exc:
        raise ValueError(f"--acceptance-length: {exc}") from None


def _acceptance_factory(args):
    """``spec -> acceptance model``: a trace, per-route alphas, or the fixed --alpha."""
    if args.acceptance_trace and args.routes:
        raise ValueError("--acceptance-trace and --routes both set: give one way to draw acceptance")
    if args.acceptance_trace:
        load_trace(args.acceptance_trace)  # fail early on a bad file
        return lambda spec: load_trace(args.acceptance_trace, seed=args.seed)
    if args.routes:
        alphas, _ = parse_routes(args.routes)
        return lambda spec: RouteAlpha(alphas, seed=args.seed)
    return lambda spec: FixedAlpha(spec.alpha, seed=args.seed)  # spec.alpha is _alpha(args)


def _traffic(args):
    """(lane_of, route_of, opt-out routes) from --lanes, --routes and --opt-out. Raises: ValueError
    for a bad share, or an opt-out route that --routes does not name."""
    lane_of = lanes_by_share(parse_lanes(args.lanes)) if args.lanes else None
    route_of, opt_out = None, tuple(r.strip() for r in (args.opt_out or "").split(",") if r.strip())
    if args.routes:
        alphas, mix = parse_routes(args.routes)
        route_of = routes_in_turn(mix)
        unknown = [r for r in opt_out if r not in alphas]
        if unknown:
            raise ValueError(f"--opt-out {','.join(unknown)}: not a route of --routes ({', '.join(alphas)})")
    elif opt_out:
        raise ValueError("--opt-out names routes: give them with --routes, "
                         "e.g. --routes chat=0.8:3,json=0.3:1")
    return lane_of, route_of, opt_out


def _prompts(args):
    """(prompts, tokenizer): route-tagged token ids, or a prompt set to tokenize."""
    if args.prompts:
        if args.routes:
            raise ValueError("--prompts and --routes both set: routes tag simulated prompts; drop one")
        return load_prompts(args.prompts), load_tokenizer(resolve_model(BUNDLED_TARGET))
    if args.routes:
        alphas, mix = parse_routes(args.routes)
        return route_prompts(args.prompt_len, mix, list(alphas)), None
    return route_prompts(args.prompt_len, ["all"], ["all"]), None
