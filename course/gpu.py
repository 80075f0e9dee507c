"""The course's third clock: minispec measured on a real GPU, beside the live CPU and the simulator.

``bench/gpu/gpu_run.py`` ran the engine on a GPU and wrote ``bench/results/gpu_<device>.json``
(committed: an NVIDIA H200, 2026-12-04). Notebooks 01 and 05 read it here: the runner's step time
T(n) for three real shapes (eager and with CUDA graphs) beside the HBM roofline, and the 8B
target's crossover beside the simulator's prediction. A learner with a GPU measures T(n) live
with :func:`step_time_rows`, the function bench/gpu/gpu_run.py itself uses.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from minispec.build.pool import build_runner
from minispec.core.block_manager import BlockManager
from minispec.core.model_runner import ForwardItem
from course.noise import median_time_s
from minispec.models.config import load_model_config

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"


def load_gpu_results(device: str = "h200") -> dict:
    """The committed run of bench/gpu/gpu_run.py on ``device`` (the file's name after ``gpu_``).

    Raises: ValueError naming the devices that have a committed run when ``device`` has none.
    """
    path = RESULTS_DIR / f"gpu_{device}.json"
    if not path.exists():
        have = sorted(p.stem.removeprefix("gpu_") for p in RESULTS_DIR.glob("gpu_*.json")
                      if "_run" not in p.stem)
        raise ValueError(f"no GPU run for {device!r} in bench/results: choose one of {', '.join(have)}, "
                         "or run `python -m bench gpu_run` on a CUDA machine")
    return json.loads(path.read_text())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forward(runner, items: list[ForwardItem], device: torch.device, reps: int) -> float:
    """Median seconds of ``runner.forward(items)`` after two warm-ups (the first records a graph)."""
    def forward() -> None:
        _sync(device)
        runner.forward(items)
        _sync(device)

    forward()
    forward()
    return median_time_s(forward, reps)


def step_time_rows(model, device: torch.device, shapes: list[tuple[int, int]], context: int = 64,
                   reps: int = 7,
                   modes: tuple[str, ...] = ("eager", "graphs"), deadline: float | None = None) -> list[dict]:
    """The runner's step time for each (requests B, tokens per request Q) in ``shapes``: B runs of
    Q tokens, each after ``context`` cached tokens (a batch of decodes for Q = 1, of verifies for
    Q = k + 1). Mode "eager" runs a plain ModelRunner, "graphs" a GraphModelRunner (on a CPU it
    runs its padded buffers eagerly). The whole forward is timed, host work included (packing the
    step, copying its inputs, the logits), not sampling or scheduling.

    Returns: one dict per (mode, shape): mode, requests, tokens_per_request, tokens, context, step_ms.
    Stops early (fewer rows) once ``deadline`` (time.perf_counter seconds) has passed.
    """
    rows = []
    dtype = model.embed_tokens.dtype
    for mode in modes:
        bm = BlockManager(max(b for b, _ in shapes) * (-(-(context + max(q for _, q in shapes)) // 16)) + 64,
                          16)
        runner = build_runner(model, bm, device, dtype, mode != "eager")
        for b, q in shapes:
            if deadline is not None and time.perf_counter() > deadline:
                break
            ids = [f"r{i}" for i in range(b)]
            for rid in ids:
                bm.allocate(rid, context + q)
            items = [ForwardItem(rid, [7] * q, context, q) for rid in ids]
            t = time_forward(runner, items, device, reps)
            for rid in ids:
                bm.free(rid)
            rows.append({"mode": mode, "requests": b, "tokens_per_request": q, "tokens": b * q,
                         "context": context,
                         "step_ms": 1000 * t})
        del runner
    return rows


def layer_overhead_ms(results: dict) -> dict[str, float]:
    """Per shape, what a batch-1 decode with CUDA graphs costs beyond its roofline, per layer (ms):
    the time the GPU spends launching and finishing small kernels, which no byte count shows."""
    out = {}
    for name, shape in results.get("steps", {}).items():
        row = next((r for r in shape.get("rows", []) if r["mode"] == "graphs" and r["tokens"] == 1), None)
        layers = shape.get("num_layers") or load_model_config(name).num_layers
        if row:
            out[name] = (row["step_ms"] - row["roofline_ms"]) / layers
    return out


def plot_step_times(ax, results: dict, live: tuple[list[int], list[float]] | None = None,
                    relative: bool = True) -> None:
    """T(n) of each shape with CUDA graphs (solid), eagerly (dotted) and on the roofline (dashed);
    ``live``: (sizes, ms) measured in the notebook, drawn in black. With ``relative`` every curve
    is divided by its 1-token step, so a CPU and a GPU share one axis."""
    def norm(pts):
        return [(n, t / pts[0][1]) for n, t in pts] if relative and pts else pts

    for color, (name, shape) in zip(("C0", "C1", "C2"), results.get("steps", {}).items()):
        rows = [r for r in shape.get("rows", []) if r["tokens_per_request"] == 1]
        for mode, style in (("graphs", "-"), ("eager", ":")):
            pts = sorted((r["tokens"], r["step_ms"]) for r in rows if r["mode"] == mode)
            if pts:
                ax.plot(*zip(*norm(pts)), style, marker="." if mode == "graphs" else None, color=color,
                        label=f"H200 {name}, {'CUDA graphs' if mode == 'graphs' else 'eager'}")
        roof = sorted({(r["tokens"], r["roofline_ms"]) for r in rows})
        if roof:
            ax.plot(*zip(*norm(roof)), "--", color=color, alpha=0.45, label=f"H200 {name}, roofline")
    if live is not None:
        ax.plot(*zip(*norm(list(zip(*live)))), "-", marker="o", color="black", label="this machine, live")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decodes per step n")
    ax.set_ylabel("step time / 1-token step" if relative else "step time, ms")


def crossover_rows(results: dict, device: str | None = None) -> list[dict]:
    """The measured crossover of a GPU run with the simulator's prediction beside each point: per
    speculating (arm, concurrency) the measured ``speedup`` over spec off, the ``simulated_speedup``
    and its relative ``error``, and ``fitted`` (True for the one point a parameter was fitted from).
    The prediction is bench/gpu/gpu_fit.py's (minispec's engine mode fitted on the run's own steps,
    ``gpu_<device>_fit.json``) where that file exists, else the one the run made itself."""
    fit_path = RESULTS_DIR / f"gpu_{device or _slug_of(results)}_fit.json"
    if fit_path.exists():
        fit = json.loads(fit_path.read_text())
        return list(fit["models"]["fitted minispec mode"]["rows"])
    return [{"arm": r["arm"], "concurrency": r["concurrency"], "speedup": r["speedup"],
             "simulated_speedup": r.get("sim_fitted_speedup"), "error": r.get("sim_fitted_speedup_error"),
             "fitted": False}
            for r in results.get("crossover", {}).get("rows", []) if r.get("arm") != "off" and "speedup" in r]


def _slug_of(results: dict) -> str:
    return results.get("device", {}).get("name", "").lower().replace("nvidia", "").strip().split(" ")[0]


def plot_crossover(ax, results: dict) -> None:
    """Measured speedups (points) and the simulator's (lines) against concurrency, one color per arm;
    the point a parameter was fitted from is ringed."""
    rows = crossover_rows(results)
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    for color, arm in zip(("C1", "C2", "C3", "C4"), arms):
        mine = [r for r in rows if r["arm"] == arm]
        ax.plot([r["concurrency"] for r in mine], [r["speedup"] for r in mine], "o", color=color,
                label=f"{arm}, H200")
        sim = [(r["concurrency"], r["simulated_speedup"]) for r in mine
               if r.get("simulated_speedup") is not None]
        if sim:
            ax.plot(*zip(*sim), "-", color=color, alpha=0.6, label=f"{arm}, simulated")
        for r in mine:
            if r.get("fitted"):
                ax.plot([r["concurrency"]], [r["speedup"]], "o", mfc="none", mec="black", ms=11,
                        label="fitted from this point")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("throughput with speculation / without")
