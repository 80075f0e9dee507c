"""``python -m minispec profile``: time the real engine on this machine and fit the cost model.

Writes data/hardware/this.json (or --output), so ``simulate --hardware this`` and the real
engine's adaptive policies use this machine's fitted bandwidth, FLOP/s and overheads.
See docs/cost_model.md (calibration) and notebook 05.
"""

from __future__ import annotations

import json
import sys
import time

from minispec.build import build_engine
from minispec.cli.args import add_engine_args, ints
from minispec.cli.preflight import check_engine_flags
from minispec.cost.hardware import HARDWARE_DIR, save_hardware
from minispec.sim.profile import fit, format_points, hardware_from_fit, measure


def add_parser(subparsers) -> None:
    """Add the ``profile`` subcommand."""
    about = ("The flags that pick the step (--kernels, --weights, --cuda-graphs, --compile) hold; the "
             "grid sets the rest (batch sizes, --ks, contexts, prefill chunks): no --spec.")
    p = subparsers.add_parser("profile", help="measure step time vs packed tokens and context; "
                                              "fit this machine", description=about)
    p.add_argument("--batch-sizes", type=ints, default=[1, 4, 16, 32], help="decode batch sizes B")
    p.add_argument("--ks", default="0,4", help="verify positions per request (0 = plain decode), e.g. 0,4")
    p.add_argument("--contexts", type=ints, default=[32, 256], help="prompt lengths (context) in tokens")
    p.add_argument("--prefill-chunks", type=ints, default=[64, 256], help="prefill chunk sizes in tokens")
    p.add_argument("--steps", type=int, default=5, help="timed steps per shape (after one warm-up step); "
                   "the median is fitted")
    p.add_argument("--output", default=None, help="hardware JSON to write (default data/hardware/this.json)")
    p.add_argument("--json", default=None, help="also write the measured points and the fit here")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Measure, fit, print the points and the fit, and write the hardware JSON."""
    ks = _verify_positions(args.ks)
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps}: must be >= 1")
    if args.spec != "off":
        raise ValueError(f"--spec {args.spec}: profile times verify steps of its own grid, not a drafter's; "
                         "give the verify positions with --ks (e.g. --ks 0,4) and leave --spec off")
    flagged = check_engine_flags(args)  # the step the engine runs, as its flags name it
    t0 = time.perf_counter()
    print(f"[minispec] profiling {args.model} ...", file=sys.stderr)
    options = {name: getattr(flagged, name) for name in ("kernels", "weights", "cuda_graphs", "compile")}
    points, spec, info = measure(build_engine, args.model, args.device, args.dtype, args.batch_sizes, ks,
                                 args.contexts, args.prefill_chunks, args.steps, engine_options=options,
                                 progress=lambda line: print(line, file=sys.stderr))
    params = fit(points)
    hw = hardware_from_fit(params, info, points)
    print(format_points(points))
    print(_fit_line(params))
    if params["ridge_at_grid_edge"]:
        print("note: every step sat on one side of the ridge, so one peak is only a bound; "
              "widen --batch-sizes / --ks", file=sys.stderr)
    out = args.output or str(HARDWARE_DIR / "this.json")
    save_hardware(hw, out)
    print(f"[minispec] wrote {out} in {time.perf_counter() - t0:.0f} s; use it with --hardware this",
          file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hardware": hw.to_dict(), "model_spec": spec.__dict__, "info": info}, f, indent=1)
    return 0


def _verify_positions(text: str) -> list[int]:
    """--ks as integers in 0..16 (0 is a plain decode step). Raises: ValueError."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ks = [-1]
    if not ks or min(ks) < 0 or max(ks) > 16:
        raise ValueError(f"--ks {text!r}: comma-separated integers in 0..16, e.g. 0,4")
    return ks


def _fit_line(params: dict) -> str:
    """The fitted cost-model parameters and the fit's relative error, on one line."""
    return (f"fit: bandwidth {params['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, compute "
            f"{params['flops_per_s'] / 1e9:.1f} GFLOP/s, "
            f"step overhead {1000 * params['step_overhead_s']:.2f} ms, "
            f"per-request overhead {1000 * params['request_overhead_s']:.3f} ms, "
            f"overlap {params['overlap']:.2f}, attention efficiency {params['attention_efficiency']:.3f}, "
            f"extra weight reads {params['extra_weight_reads']:.2f}; "
            f"relative error rms {params['rms_rel_error']:.1%}, max {params['max_rel_error']:.1%}")
