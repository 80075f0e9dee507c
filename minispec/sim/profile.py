"""Profile this machine: time real engine steps, fit the cost model's parameters, save ``this``.

The real engine runs the real model (or a random-weight one of a real shape) over a grid of
packed decode batches (B requests, k verify positions each, contexts of a few lengths) and a few
prefill chunk sizes. Each whole ``engine.step()`` is timed, so scheduling and sampling land in the
fitted overheads. The fit is the cost model itself,
    memory  = (weight_bytes (1 + extra_weight_reads [N >= 2]) + other_bytes) / bandwidth
    compute = (linear_FLOPs + attention_FLOPs / attention_efficiency) / flops
    t = max(memory, compute) + (1 - overlap) min(memory, compute) + step_overhead + B x request_overhead,
solved by least squares on relative error: for each candidate (overlap, attention_efficiency,
extra_weight_reads, ridge point rho = flops / bandwidth) the model is linear in (step_overhead,
request_overhead, 1 / bandwidth), and the best candidate wins. On a GPU the fit should find the
roofline (overlap 1, no extra reads); a CPU's BLAS packs weights for multi-row products and
overlaps little, which is why those knobs exist.
Invariant: the saved HardwareSpec reproduces the measured steps within the reported error.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import datetime
import gc
import os
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.models.loader import load_model, pick_device, pick_dtype
from minispec.models.machine import machine_name  # noqa: F401 (the course imports it from here too)
from minispec.core.request import SamplingParams
from minispec.cost.model import CostModel, batch_items
from minispec.cost.hardware import HardwareSpec
from minispec.cost.modelspec import ModelSpec
from minispec.speculation.policy import AlwaysPolicy


@dataclass
class ProfilePoint:
    """One timed step: its shape (B requests, k drafts each, mean context), its cost features
    (see ``CostModel.features``) and its measured seconds."""

    kind: str            # "decode" or "prefill"
    num_requests: int
    k: int
    context: int
    num_tokens: int
    linear_flops: float
    attention_flops: float
    weight_bytes: float
    other_bytes: float
    time_s: float
    predicted_s: float | None = None


class _Recorder:
    """An engine observer keeping the shape (FLOPs, bytes) of the last step's Batch."""

    def __init__(self, cost_model: CostModel):
        self.cost_model = cost_model
        self.last = None

    def __call__(self, record) -> None:
        batch = record.batch  # drafts are filled in; counters not yet updated
        self.last = (self.cost_model.features(batch_items(batch)), batch)


def unit_hardware() -> HardwareSpec:
    """Peaks of 1 and no overhead: a cost model on it returns raw FLOPs and bytes."""
    return HardwareSpec("unit", "unit costs", 1.0, 1.0, 1.0, 1.0, 1.0)


def _time_step(engine, probe, kind: str, k: int) -> ProfilePoint:
    """Run and time one whole ``engine.step()`` (scheduling and sampling included) with k drafts;
    ``probe`` is the engine's (policy, _Recorder)."""
    policy, recorder = probe
    policy.k = k
    t0 = time.perf_counter()
    engine.step()
    dt = time.perf_counter() - t0
    feats, batch = recorder.last
    ctx = [s.request.num_computed_tokens for s in batch.scheduled]
    return ProfilePoint(kind, len(batch.scheduled), k, int(sum(ctx) / len(ctx)), feats["num_tokens"],
                        feats["linear_flops"], feats["attention_flops"], feats["weight_bytes"],
                        feats["other_bytes"], dt)


def _median_point(timed: list[ProfilePoint]) -> ProfilePoint:
    """The middle step's shape with the median time of all its repeats."""
    return replace(timed[len(timed) // 2], time_s=float(np.median([p.time_s for p in timed])))


def measure(build_engine, model_name: str = "smollm2-135m-instruct", device=None, dtype=None,
            batch_sizes=(1, 4, 16, 32), ks=(0, 4), contexts=(32, 256), prefill_chunks=(64, 256),
            num_steps: int = 5, max_prefill_tokens: int = 4096, engine_options: dict | None = None,
            progress=print) -> tuple[list[ProfilePoint], ModelSpec, dict]:
    """Time real engine steps over the grid. Returns (points, the model's spec, run info).
    ``engine_options``: EngineConfig fields the engine is profiled with (kernels, weights,
    cuda_graphs, compile: the CLI's flags), so the fit is of the step the engine will run.

    ``build_engine`` is ``minispec.build.build_engine``, passed in by the caller: the simulator
    sits below the real engine's builder and never imports it.

    Decode shapes: B requests (``batch_sizes``, while B x context stays within
    ``max_prefill_tokens``) at each context, each decoding with k synthetic drafts that are all
    rejected (alpha = 0), so a step packs B (k + 1) tokens. Every shape gets its own engine, and
    the timed steps go round-robin over all shapes and ks, ``num_steps`` rounds, so a slow spell of
    a shared machine lands on every shape alike; each point is a shape's median step.
    Prefill points: one prompt of 4 chunks per chunk size, chunk by chunk (median of the last 3).
    """
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    model, tokenizer, hf_config = load_model(model_name, dev, dt)
    dtype_name = str(dt).removeprefix("torch.")
    spec = ModelSpec.of(replace(model.cfg, name=model_name), dtype_name)
    recorder_cm = CostModel(unit_hardware(), spec)
    max_k = max(max(ks), 1)
    growth = (num_steps + 2) * len(ks) * (max_k + 1) + 16
    max_len = min(model.cfg.max_position_embeddings,
                  max(max(contexts) + growth, 4 * max(prefill_chunks) + 16))
    vocab = model.cfg.vocab_size
    rng = np.random.default_rng(0)

    def engine_for(budget: int, num_requests: int):
        cfg = EngineConfig(model=model_name, device=str(dev), dtype=dtype_name, block_size=16,
                           num_kv_blocks=num_requests * (-(-max_len // 16)) + 4, max_model_len=max_len,
                           scheduler=SchedulerConfig(max_num_batched_tokens=budget,
                                                     max_num_seqs=num_requests),
                           spec=SpecConfig(method="synthetic", num_speculative_tokens=max_k, alpha=0.0),
                           **(engine_options or {}))
        policy = AlwaysPolicy(0)  # this profiler's own policy: its k is set per timed step
        engine = build_engine(cfg, model, tokenizer, hf_config, policy=policy)
        return engine, (policy, engine.add_observer(_Recorder(recorder_cm)))

    def prompt(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, vocab, n)]

    params = SamplingParams(max_tokens=max_len - max(contexts) - 8, temperature=0.0, ignore_eos=True)
    shapes = []  # (engine, recorder, B, context), every request prefilled
    for ctx in contexts:
        for b in sorted(batch_sizes):
            if b > 1 and b * ctx > max_prefill_tokens:
                continue
            engine, recorder = engine_for(2048, b)
            for _ in range(b):
                engine.add_request(prompt(ctx), params)
            while any(r.is_prefill for r in engine.requests.values()):
                engine.step()  # prefill, untimed
            for k in ks:
                _time_step(engine, recorder, "decode", k)  # warm-up: the first step of a shape
            shapes.append((engine, recorder, b, ctx))
    timed: dict[tuple[int, int], list[ProfilePoint]] = {}
    for _ in range(num_steps):
        for i, (engine, recorder, _, _) in enumerate(shapes):
            for k in ks:
                timed.setdefault((i, k), []).append(_time_step(engine, recorder, "decode", k))
    points = [_median_point(v) for v in timed.values()]
    for p in points:
        progress(f"  decode B={p.num_requests:3d} k={p.k} context~{p.context:5d}: {p.num_tokens:4d} tokens, "
                 f"{1000 * p.time_s:7.1f} ms/step (median of {num_steps})")
    del shapes, timed
    gc.collect()  # every engine holds KV tensors and is a reference cycle
    for chunk in prefill_chunks:
        engine, recorder = engine_for(chunk, 1)
        engine.add_request(prompt(4 * chunk), params)
        _time_step(engine, recorder, "prefill", 0)  # warm-up chunk
        points.append(_median_point([_time_step(engine, recorder, "prefill", 0) for _ in range(3)]))
        progress(f"  prefill chunk={chunk:4d}: {1000 * points[-1].time_s:7.1f} ms/step (median of 3)")
    return points, spec, _run_info(dev, dtype_name, model_name)


def _run_info(dev: torch.device, dtype_name: str, model_name: str) -> dict:
    """Where a profile was measured: device name and memory, dtype, model, threads, date."""
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        memory = float(torch.cuda.get_device_properties(dev).total_memory)
    else:
        name = machine_name("cpu")
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"device": name, "device_type": dev.type, "memory_bytes": memory, "dtype": dtype_name,
            "model": model_name, "num_threads": torch.get_num_threads(),
            "date": datetime.date.today().isoformat()}


def _lstsq_nonneg(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (drop the most negative column and refit; 3 columns)."""
    active = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        if active:
            sol, *_ = np.linalg.lstsq(a[:, active], y, rcond=None)
            coef[active] = sol
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            return coef
        active.remove(min(negative, key=lambda i: coef[i]))


OVERLAPS = (0.0, 0.25, 0.5, 0.75, 1.0)
ATTENTION_EFFICIENCIES = (1.0, 0.5, 0.25, 0.125)
EXTRA_WEIGHT_READS = tuple(x / 4 for x in range(13))  # 0 .. 3 passes


def fit(points: list[ProfilePoint]) -> dict:
    """Fit bandwidth, FLOP/s, overheads and the three CPU knobs to the points (relative least
    squares, see the module doc).

    Returns: dict with bandwidth_bytes_per_s, flops_per_s, step_overhead_s, request_overhead_s,
        overlap, attention_efficiency, extra_weight_reads, rms_rel_error, max_rel_error and
        ridge_at_grid_edge (True when the data never crossed the ridge, so one of the peaks is only
        a bound). Raises ValueError with fewer than 4 points.
    """
    if len(points) < 4:
        raise ValueError(f"fit needs at least 4 timed steps, got {len(points)}")
    t = np.array([p.time_s for p in points])
    lin = np.array([p.linear_flops for p in points])
    att = np.array([p.attention_flops for p in points])
    wb = np.array([p.weight_bytes for p in points])
    ob = np.array([p.other_bytes for p in points])
    multi = np.array([p.num_tokens >= 2 for p in points], dtype=float)
    b = np.array([p.num_requests for p in points], dtype=float)
    w = 1.0 / t
    ones = np.ones_like(t)
    def search(extras, att_effs, overlaps, rhos_for, best=None):
        for extra in extras:
            m = wb * (1.0 + extra * multi) + ob
            for att_eff in att_effs:
                f = lin + att / att_eff
                grid = rhos_for(f / m)
                for overlap in overlaps:
                    for rho in grid:
                        work = np.maximum(m, f / rho) + (1.0 - overlap) * np.minimum(m, f / rho)
                        a = np.stack([ones, b, work], axis=1) * w[:, None]
                        coef = _lstsq_nonneg(a, t * w)
                        err = a @ coef - t * w
                        sse = float(err @ err)
                        if coef[2] > 0 and (best is None or sse < best[0]):
                            edge = rho * 8 <= (f / m).min() or rho >= (f / m).max() * 8
                            best = (sse, rho, coef, overlap, att_eff, extra, edge)
        return best

    best = search(EXTRA_WEIGHT_READS, ATTENTION_EFFICIENCIES, OVERLAPS,
                  lambda ratio: np.geomspace(ratio.min() / 8, ratio.max() * 8, 120))
    if best is None:
        raise ValueError("profile: step times do not grow with bytes or FLOPs, so the fit found no "
                         "bandwidth; on a model this small Python overhead hides the weight reads, or the "
                         "machine was busy: profile a larger model, "
                         "add --batch-sizes / --ks, or raise --steps")
    rho0 = best[1]  # refine the ridge point around the coarse optimum
    best = search([best[5]], [best[4]], [best[3]],
                  lambda ratio: np.geomspace(rho0 / 1.1, rho0 * 1.1, 200), best)
    _, rho, (o_step, o_req, inv_bw), overlap, att_eff, extra, edge = best
    m = wb * (1.0 + extra * multi) + ob
    f = lin + att / att_eff
    pred = o_step + o_req * b + inv_bw * (np.maximum(m, f / rho) + (1.0 - overlap) * np.minimum(m, f / rho))
    rel = (pred - t) / t
    for p, q in zip(points, pred):
        p.predicted_s = float(q)
    return {"bandwidth_bytes_per_s": 1.0 / inv_bw, "flops_per_s": rho / inv_bw,
            "step_overhead_s": float(o_step), "request_overhead_s": float(o_req), "overlap": float(overlap),
            "attention_efficiency": float(att_eff), "extra_weight_reads": float(extra),
            "rms_rel_error": float(np.sqrt(np.mean(rel ** 2))), "max_rel_error": float(np.max(np.abs(rel))),
            "ridge_flops_per_byte": float(rho),
            "ridge_at_grid_edge": bool(edge)}


def hardware_from_fit(params: dict, info: dict, points: list[ProfilePoint]) -> HardwareSpec:
    """A HardwareSpec named "this" whose peaks are the fitted effective values (efficiency 1)."""
    how = (f"fitted by `python -m minispec profile` on {info['date']} from {len(points)} timed steps of "
           f"{info['model']} ({info['dtype']}, {info['num_threads']} threads)")
    return HardwareSpec(
        name="this", description=f"this machine: {info['device']} ({info['device_type']})",
        dense_flops_per_s=params["flops_per_s"], memory_bandwidth_bytes_per_s=params["bandwidth_bytes_per_s"],
        memory_bytes=info["memory_bytes"], compute_efficiency=1.0, bandwidth_efficiency=1.0,
        step_overhead_s=params["step_overhead_s"], request_overhead_s=params["request_overhead_s"],
        overlap=params["overlap"], attention_efficiency=params["attention_efficiency"],
        extra_weight_reads=params["extra_weight_reads"], flops_dtype=info["dtype"],
        default_dtype=info["dtype"], device_type=info["device_type"], forward_overhead_s=0.0,
        draft_forward_overhead_s=params["step_overhead_s"],
        engine_mode="minispec-cuda-graphs" if info["device_type"] == "cuda" else "minispec-eager",
        sources={"dense_flops_per_s": how + " (effective, not peak)",
                 "memory_bandwidth_bytes_per_s": how + " (effective, not peak)",
                 "memory_bytes": "total memory reported by the OS (CPU) or by CUDA (GPU)",
                 "compute_efficiency": "1: the fitted FLOP/s is already the achieved rate",
                 "bandwidth_efficiency": "1: the fitted bandwidth is already the achieved rate",
                 "step_overhead_s": how + "; includes the engine's Python scheduling and sampling",
                 "request_overhead_s": how, "overlap": how, "attention_efficiency": how,
                 "extra_weight_reads": how,
                 "device_type": "the device profiled (torch's device.type)",
                 "forward_overhead_s": "0: whole-step timings cannot separate a forward's fixed time from "
                                       "the step's; it is inside step_overhead_s",
                 # profile times no draft forward; an eager draft forward pays per-layer Python as the
                 # target's does
                 "draft_forward_overhead_s": "assumed equal to the fitted step_overhead_s (no draft "
                                             "forward is timed)",
                 "engine_mode": f"minispec's own engine on {info['device']} as profile ran it (CUDA graphs "
                                "on a GPU, eager PyTorch elsewhere)"},
        fit={**{k: v for k, v in params.items()}, "model": info["model"], "device": info["device"],
             "num_points": len(points),
             "points": [{"kind": p.kind, "num_requests": p.num_requests, "k": p.k, "context": p.context,
                         "num_tokens": p.num_tokens, "time_s": round(p.time_s, 6),
                         "predicted_s": round(p.predicted_s, 6)} for p in points]})


def format_points(points: list[ProfilePoint]) -> str:
    """A table of measured against fitted step times."""
    lines = ["kind    |   B | k | context | tokens | measured ms | fitted ms | error"]
    for p in points:
        err = (p.predicted_s - p.time_s) / p.time_s if p.predicted_s else 0.0
        lines.append(f"{p.kind:7s} | {p.num_requests:3d} | {p.k} | {p.context:7d} | {p.num_tokens:6d} | "
                     f"{1000 * p.time_s:11.1f} | {1000 * (p.predicted_s or 0):9.1f} | {err:+6.1%}")
    return "\n".join(lines)
