"""Fit minispec's own engine mode on a GPU from one run of bench/gpu/gpu_run.py.

The run measured, on one device: its copy bandwidth and matmul rate (the ceilings), the model
runner's step time T(n) for three shapes with CUDA graphs and eagerly, and whole engine steps of
the 8B shape (decode and verify batches replayed from graphs, prompt chunks run eagerly). Those
give an engine mode (``HardwareSpec.engine_modes``) in four steps, each from its own measurements:
1. efficiencies: the measured ceilings over the datasheet's peaks;
2. ``layer_overhead_s``: per shape, a batch-1 decode's time with graphs beyond its roofline, per
   layer; the median over the shapes (their depths differ: 30, 16 and 32 layers);
3. ``step_overhead_s`` and ``request_overhead_s``: the engine's decode and verify steps less their
   roofline and layer times, least squares over the steps (non-negative), for the roofline's
   overlap (1) and the additive model (0), whichever fits better;
4. ``eager_layer_overhead_s``: the engine's prompt-chunk steps less roofline, step and request
   times, per layer (``graph_max_query``: 32, the GraphModelRunner's).
The crossover the run also measured is never used here: it is what the fitted mode predicts
(bench/gpu/gpu_fit.py prints the comparison). Taught in notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

import numpy as np

from minispec.models.config import load_model_config
from minispec.cost.model import CostModel
from minispec.cost.hardware import HardwareSpec
from minispec.cost.modelspec import ModelSpec

GRAPH_MAX_QUERY = 32  # minispec.graphs.cuda_graphs.GraphModelRunner's default max_query


def _roofline_s(hw: HardwareSpec, spec: ModelSpec, items: list[tuple[int, int, int]]) -> float:
    """The roofline seconds of a forward over (q, c, r) items on ``hw`` with no fixed time."""
    bare = replace(hw, step_overhead_s=0.0, forward_overhead_s=0.0, request_overhead_s=0.0,
                   layer_overhead_s=0.0, eager_layer_overhead_s=None, draft_forward_overhead_s=None)
    return CostModel(bare, spec).items_cost(items).time_s


def _profile_items(point: dict) -> list[tuple[int, int, int]]:
    """A profile point's forward as (q, c, r) items: B decodes of k + 1 rows, or one prompt chunk."""
    if point["kind"] == "prefill":
        return [(point["num_tokens"], point["context"] - point["num_tokens"], 1)]
    q = point["k"] + 1
    return [(q, point["context"], q)] * point["num_requests"]


def fit_engine_mode(run: dict, peak: HardwareSpec, profile_shape: str = "llama-3-8b") -> dict:
    """The engine-mode entry (fields, "description", "sources") for minispec on ``peak``'s device,
    from ``run``, a bench/gpu/gpu_run.py result dict (see the module doc for the four steps).

    Args:
        peak: the device's datasheet spec (e.g. ``load_hardware("h200")``).
        profile_shape: the preset whose engine steps the run's profile section timed.
    Raises: ValueError when the run lacks its device, steps or profile section.
    """
    for key in ("device", "steps", "profile"):
        if key not in run:
            raise ValueError(f"the GPU run has no {key!r} section: rerun bench/gpu/gpu_run.py with it")
    dev = run["device"]
    bw_eff = min(1.0, dev["copy_bandwidth_bytes_per_s"] / peak.memory_bandwidth_bytes_per_s)
    fl_eff = min(1.0, dev["matmul_flops_per_s"] / peak.dense_flops_per_s)
    dtype = run.get("dtype", "bfloat16")
    per_layer = []
    for name, shape in run["steps"].items():
        row = next((r for r in shape.get("rows", []) if r["mode"] == "graphs" and r["tokens"] == 1), None)
        if row:
            per_layer.append((row["step_ms"] - row["roofline_ms"]) / 1000
                             / load_model_config(name).num_layers)
    layer_s = statistics.median(per_layer)
    spec = ModelSpec.of(load_model_config(profile_shape), dtype)
    points = run["profile"]["hardware"]["fit"]["points"]
    decode = [p for p in points if p["kind"] == "decode"]
    prefill = [p for p in points if p["kind"] == "prefill"]
    best = None
    for overlap in (0.0, 1.0):
        hw = replace(peak, bandwidth_efficiency=bw_eff, compute_efficiency=fl_eff, overlap=overlap)
        rest = np.array([p["time_s"] - _roofline_s(hw, spec, _profile_items(p)) - layer_s * spec.num_layers
                         for p in decode])
        a = np.stack([np.ones(len(decode)), [p["num_requests"] for p in decode]], axis=1)
        w = 1.0 / np.array([p["time_s"] for p in decode])  # relative error
        coef, *_ = np.linalg.lstsq(a * w[:, None], rest * w, rcond=None)
        coef = np.maximum(coef, 0.0)
        sse = float((((a @ coef) - rest) * w) @ (((a @ coef) - rest) * w))
        if best is None or sse < best[0]:
            best = (sse, overlap, hw, float(coef[0]), float(coef[1]))
    _, overlap, hw, step_s, request_s = best
    eager = [(p["time_s"] - _roofline_s(hw, spec, _profile_items(p)) - step_s - request_s) / spec.num_layers
             for p in prefill]
    eager_s = max(statistics.median(eager), layer_s) if eager else layer_s
    where = (f"bench/results/gpu_{run.get('slug', 'h200')}.json: bench/gpu/gpu_run.py on {dev['name']}, "
             f"{run['date']}, torch {dev['torch']}, fitted by minispec.sim.engine_fit")
    return {
        "description": "minispec's own engine (CUDA graphs for decode and verify steps, eager prompt "
                       f"chunks) on {dev['name']}, measured {run['date']}",
        "bandwidth_efficiency": bw_eff, "compute_efficiency": fl_eff, "overlap": overlap,
        "step_overhead_s": step_s, "request_overhead_s": request_s, "forward_overhead_s": 0.0,
        "draft_forward_overhead_s": 0.0, "layer_overhead_s": layer_s, "eager_layer_overhead_s": eager_s,
        "graph_max_query": GRAPH_MAX_QUERY,
        "sources": {
            "bandwidth_efficiency": f"{where}: a device-to-device copy moved "
                                    f"{dev['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s (bytes read and "
                                    "written), over the datasheet's peak",
            "compute_efficiency": f"{where}: an 8192^3 bf16 matmul ran at "
                                  f"{dev['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s, "
                                  "over the datasheet's dense peak",
            "overlap": f"{where}: the engine's decode and verify steps fit better with overlap {overlap:g}",
            "layer_overhead_s": f"{where}: a batch-1 decode with CUDA graphs less its roofline, per layer, "
                                "median over three shapes "
                                f"({', '.join(f'{1e6 * x:.0f}' for x in per_layer)} us)",
            "eager_layer_overhead_s": f"{where}: the engine's prompt-chunk steps (eager) less roofline, step "
                                      f"and request times, per layer of the {profile_shape} shape",
            "step_overhead_s": f"{where}: least squares over {len(decode)} engine decode and verify steps of "
                               f"the {profile_shape} shape, after their roofline and layer times",
            "request_overhead_s": f"{where}: the same fit, per request in a step (scheduling, sampling, "
                                  "verifying in Python; the runner's packing)",
            "forward_overhead_s": "0: in the layer and request terms",
            "draft_forward_overhead_s": "0: a draft forward pays the same layer and request terms as the "
                                        "target's",
            "graph_max_query": "minispec/graphs/cuda_graphs.py: GraphModelRunner replays runs of up to 32 "
                               "tokens; a longer run (a prompt chunk) makes the step eager",
        },
    }
