"""The simulator held to minispec measured on a GPU: fit minispec's engine mode from a run of
bench/gpu/gpu_run.py, then predict that run's crossover with it and print the error per point.

    python -m bench gpu_fit                  # bench/results/gpu_h200.json -> gpu_h200_fit.json
    python -m bench gpu_fit --write-mode     # also store the mode in data/hardware/h200.json

The fit (minispec/sim/engine_fit.py) reads the run's ceilings, its runner step times and its
engine steps, never its crossover; the crossover waves are then simulated exactly as the run
measured them (the same configs, prompts and pinned acceptance, one engine per arm), with three
models of the device: the fitted minispec mode, the profile fitted during the run (bench/gpu/gpu_run.py's
own, without per-layer times), and the file's stock mode (vLLM 0.10's overheads).
Runs on a CPU in about a minute; writes the predictions next to the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_run import ARMS, Plan, crossover_prompts, run_wave  # noqa: E402
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig  # noqa: E402
from minispec.sim import build_sim_engine  # noqa: E402
from minispec.sim.engine_fit import fit_engine_mode  # noqa: E402
from minispec.cost.hardware import HARDWARE_DIR, HardwareSpec, load_hardware  # noqa: E402
from minispec.cost.modelspec import ModelSpec  # noqa: E402
from minispec.speculation.acceptance import FixedAlpha  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
MODE = "minispec-cuda-graphs"


def simulate_crossover(run: dict, hardware: HardwareSpec, arms=ARMS, concurrencies=None) -> dict[tuple[str, int], float]:
    """Throughput (tok/s) of every (arm, concurrency) wave of the run's crossover, simulated on
    ``hardware`` with the run's own settings."""
    cross = run["crossover"]
    plan = Plan(tiny=False)
    plan.prompt_len, plan.output_len = cross["prompt_tokens"], cross["output_tokens"]
    target, draft = ModelSpec.of(plan.shapes["llama-3-8b"], run["dtype"]), ModelSpec.of(plan.draft_1b, run["dtype"])
    max_len = plan.prompt_len + plan.output_len + 16
    every = sorted({r["concurrency"] for r in cross["rows"] if "concurrency" in r})
    concurrencies = concurrencies or every
    prompts = crossover_prompts(plan, target.vocab_size, max(every))
    out = {}
    for name, alpha, kind in arms:
        spec = SpecConfig() if alpha is None else SpecConfig(method="draft" if kind else "synthetic",
                                                             num_speculative_tokens=cross["k"], alpha=alpha)
        for c in concurrencies:
            config = EngineConfig(model="random", block_size=16, num_kv_blocks=max(every) * (-(-max_len // 16)) + 16,
                                  max_model_len=max_len, enable_prefix_caching=False,
                                  scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=max(every)),
                                  spec=spec)
            engine = build_sim_engine(config, hardware=hardware, model=target, draft=draft if kind else None,
                                      acceptance=FixedAlpha(alpha, 0) if alpha is not None else None)
            out[(name, c)] = run_wave(engine, c, prompts, plan)["throughput_tok_s"]
    return out


def fit_draft_request_overhead(run: dict, hardware: HardwareSpec, arm: str = "1B draft a=0.8") -> dict:
    """The per-request time of each draft forward that gives the simulated ``arm`` the measured
    speedup over spec off at the run's highest concurrency (bisection, 0 to 5 ms)."""
    rows = [r for r in run["crossover"]["rows"] if r.get("arm") == arm and "speedup" in r]
    target = max(rows, key=lambda r: r["concurrency"])
    c = target["concurrency"]
    arm_def = next(a for a in ARMS if a[0] == arm)
    off = simulate_crossover(run, hardware, arms=[ARMS[0]], concurrencies=[c])[("off", c)]
    lo, hi = 0.0, 0.005
    for _ in range(14):
        mid = (lo + hi) / 2
        hw = HardwareSpec(**{**hardware.to_dict(), "draft_request_overhead_s": mid})
        sim = simulate_crossover(run, hw, arms=[arm_def], concurrencies=[c])[(arm, c)] / off
        lo, hi = (mid, hi) if sim > target["speedup"] else (lo, mid)
    return {"arm": arm, "concurrency": target["concurrency"], "value_s": (lo + hi) / 2}


def compare(run: dict, predicted: dict[tuple[str, int], float], fitted: tuple[str, int] | None = None) -> list[dict]:
    """Per speculating (arm, concurrency): measured and predicted speedup over spec off, and the
    error; ``fitted``: the point a fitted parameter was set from (marked, left out of summaries)."""
    measured = {(r["arm"], r["concurrency"]): r["throughput_tok_s"] for r in run["crossover"]["rows"] if "throughput_tok_s" in r}
    rows = []
    for (arm, c), tok_s in measured.items():
        if arm == "off" or ("off", c) not in measured:
            continue
        speedup = tok_s / measured[("off", c)]
        sim = predicted[(arm, c)] / predicted[("off", c)]
        rows.append({"arm": arm, "concurrency": c, "speedup": speedup, "simulated_speedup": sim,
                     "error": sim / speedup - 1, "throughput_error": predicted[(arm, c)] / tok_s - 1,
                     "fitted": (arm, c) == fitted})
    return rows


def summary(rows: list[dict]) -> dict:
    errs = [abs(r["error"]) for r in rows if not r["fitted"]]
    return {"median_abs_speedup_error": statistics.median(errs), "max_abs_speedup_error": max(errs), "points": len(errs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=str(RESULTS / "gpu_h200.json"))
    ap.add_argument("--hardware", default="h200", help="the run's device in data/hardware/")
    ap.add_argument("--write-mode", action="store_true", help=f"store the fitted mode as {MODE!r} in the hardware file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    run = json.loads(Path(args.run).read_text())
    peak = load_hardware(args.hardware)
    mode = fit_engine_mode(run, peak)
    fields = {k: v for k, v in mode.items() if k not in ("description", "sources")}
    print("fitted from the run's steps: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()))
    fitted = HardwareSpec(**{**peak.to_dict(), **fields, "engine_mode": MODE})
    # the drafter's own host work per request has no measurement of its own in the run: fitted from
    # one crossover point (the draft arm at the highest concurrency), the others are predictions
    point = fit_draft_request_overhead(run, fitted)
    mode["draft_request_overhead_s"] = fields["draft_request_overhead_s"] = point["value_s"]
    mode["sources"]["draft_request_overhead_s"] = (
        f"fitted so that the simulated {point['arm']} wave at concurrency {point['concurrency']} matches the "
        "measured one (bench/gpu/gpu_fit.py): the run times no drafter apart; that point is left out of the errors")
    if args.write_mode:
        path = HARDWARE_DIR / f"{args.hardware}.json"
        data = json.loads(path.read_text())
        data.setdefault("engine_modes", {})[MODE] = mode
        path.write_text(json.dumps(data, indent=1) + "\n")
        peak = load_hardware(args.hardware)
    models = {"fitted minispec mode": HardwareSpec(**{**peak.to_dict(), **fields, "engine_mode": MODE}),
              "profile fitted in the run": HardwareSpec(**run["profile"]["hardware"]),
              f"stock {args.hardware} ({peak.engine_mode})": peak}
    result = {"run": Path(args.run).name, "date": time.strftime("%Y-%m-%d"), "mode": mode, "models": {}}
    for label, hw in models.items():
        rows = compare(run, simulate_crossover(run, hw),
                       (point["arm"], point["concurrency"]) if label == "fitted minispec mode" else None)
        result["models"][label] = {"summary": summary(rows), "rows": rows}
    print(f"\n{'arm':16s} |   c | measured |" + "".join(f" {label[:22]:>22s} |" for label in models))
    base = result["models"][next(iter(models))]["rows"]
    for i, r in enumerate(base):
        cells = "".join(f" {result['models'][m]['rows'][i]['simulated_speedup']:6.2f} ({result['models'][m]['rows'][i]['error']:+6.1%})"
                        f"{'':>6s} |" for m in models)
        print(f"{r['arm']:16s} | {r['concurrency']:3d} | {r['speedup']:8.2f} |{cells}" + (" (fitted here)" if r["fitted"] else ""))
    for label, m in result["models"].items():
        s = m["summary"]
        print(f"{label}: speedup error median {s['median_abs_speedup_error']:.1%}, worst {s['max_abs_speedup_error']:.1%} "
              f"over {s['points']} points")
    out = Path(args.run).with_name(Path(args.run).stem + "_fit.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
