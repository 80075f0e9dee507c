"""minispec on a GPU, in one prepared run: exactness, step time T(n), batch-1 decode, the
crossover, and the simulator's prediction of each, measured on the device itself.

    python -m bench gpu_run                      # on a CUDA machine: writes bench/results/gpu_<device>.json + .png
    python -m bench gpu_run --device cpu --tiny  # the same sections on tiny shapes (a test runs this)

Needs only PyTorch, numpy and transformers (no downloads, no model file): every model has random
weights of a real shape (the bundled SmolLM2-135M's, Llama-3.2-1B's, Llama-3-8B's), which sets
the step time; acceptance in the crossover is pinned (synthetic) because random models agree on
nothing. Sections, each timed and each kept when a later one fails:
1. device: name, memory, the HBM copy bandwidth and the bf16 matmul rate measured now (the roofline);
2. exactness: float32, the bundled model's shape, greedy output with speculation (n-gram, a draft
   model, the target as its own draft, an EAGLE head; chains and trees) against plain output,
   prefix caching on, CUDA graphs on; graphs against eager; bfloat16 against float32 agreement;
3. steps: the runner's step time T(n) for n decodes (and verifies of k + 1 = 5 rows) in bfloat16,
   eager and with CUDA graphs, beside the roofline (weights and KV at the measured bandwidth, FLOPs
   at the measured matmul rate), and batch-1 decode tokens/s as a fraction of that roofline;
4. profile: whole engine steps of the 8B shape timed and fitted (``minispec profile``'s fit);
5. crossover: the 8B target, speculation off against synthetic drafts (alpha 0.6 and 0.8, k 4)
   and a 1B draft model's real forwards (acceptance pinned at 0.8), concurrency 1..128, closed
   loop, one wave of requests; beside each point the simulator's prediction with the profile
   fitted in step 4 and with the stock hardware entry (datasheet peaks, 1 ms per forward).
A global deadline (``--budget-s``) skips what would not finish in time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from minispec.build import build_engine  # noqa: E402
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig  # noqa: E402
from course.gpu import step_time_rows  # noqa: E402
from minispec.tools.summary import summarize  # noqa: E402
from minispec.models.config import ModelConfig, load_model_config  # noqa: E402
from minispec.models.eagle import build_eagle  # noqa: E402
from minispec.models.llama import LlamaModel  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.cost.model import CostModel  # noqa: E402
from minispec.sim.executor import build_sim_engine  # noqa: E402
from minispec.cost.hardware import HardwareSpec, load_hardware  # noqa: E402
from minispec.cost.modelspec import ModelSpec  # noqa: E402
from minispec.sim.profile import fit, hardware_from_fit, measure  # noqa: E402
from minispec.speculation.acceptance import FixedAlpha  # noqa: E402
from minispec.speculation.drafter_guard import DrafterGuard  # noqa: E402
from minispec.core.drafters import DraftModelDrafter  # noqa: E402
from minispec.speculation.synthetic import verify_synthetic  # noqa: E402
from minispec.tools.workload import run_closed_loop  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"


def tiny_shape(name: str, layers: int = 2) -> ModelConfig:
    """A small Llama shape for ``--tiny`` (CPU tests): same code paths, milliseconds per step."""
    return ModelConfig.tiny(512, num_layers=layers, max_position_embeddings=1024, name=name)


class Plan:
    """What a run measures: real shapes on a GPU, tiny ones with ``--tiny``."""

    def __init__(self, tiny: bool):
        self.tiny = tiny
        if tiny:
            self.shapes = {"smollm2-135m": tiny_shape("tiny-a", 2), "llama-3.2-1b": tiny_shape("tiny-b", 3),
                           "llama-3-8b": tiny_shape("tiny-c", 4)}
            self.draft_1b = tiny_shape("tiny-draft", 1)
            self.ns = [1, 2, 4]
            self.verify_bs = [2]
            self.concurrencies = [1, 2]
            self.prompt_len, self.output_len, self.exact_tokens = 16, 8, 8
            self.reps = 2
            self.profile_batch_sizes, self.profile_contexts, self.profile_chunks = (1, 2, 4), (16,), (16,)
            self.profile_max_len = 128
        else:
            self.shapes = {name: load_model_config(name) for name in ("smollm2-135m", "llama-3.2-1b", "llama-3-8b")}
            self.draft_1b = load_model_config("llama-3.2-1b")
            self.ns = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
            self.verify_bs = [1, 8, 32]
            self.concurrencies = [1, 2, 4, 8, 16, 32, 64, 128]
            self.prompt_len, self.output_len, self.exact_tokens = 128, 128, 48
            self.reps = 7
            # KV pools are sized for profile_max_len per request, one engine per shape, all alive at once
            self.profile_batch_sizes, self.profile_contexts, self.profile_chunks = (1, 8, 32, 128), (128, 384), (64, 256)
            self.profile_max_len = 1040
        self.context = 64  # tokens each decode of T(n) attends


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0, max_len: int = 2048):
    cfg = replace(cfg, max_position_embeddings=min(cfg.max_position_embeddings, max_len))
    return LlamaModel.random(cfg, seed, dtype, device).eval().requires_grad_(False)


# -- 1. the device ------------------------------------------------------------------------------
def device_section(device: torch.device, tiny: bool) -> dict:
    """Name, memory and the two ceilings measured now: copy bandwidth (bytes read + written per
    second) and the bf16 (CPU: float32) matmul rate."""
    info = {"torch": torch.__version__, "python": platform.python_version(), "device_type": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=torch.cuda.get_device_name(device), memory_bytes=props.total_memory,
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    else:
        info.update(name=platform.processor() or platform.machine(), memory_bytes=None)
    n = (1 << 20) if tiny else (1 << 30)  # bytes per buffer
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    times = []
    for i in range(6):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    info["copy_bandwidth_bytes_per_s"] = 2 * n / float(np.median(times))
    del src, dst
    m = 512 if tiny else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(m, m, dtype=dtype, device=device)
    b = torch.randn(m, m, dtype=dtype, device=device)
    times = []
    for i in range(6):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    info["matmul_flops_per_s"] = 2 * m ** 3 / float(np.median(times))
    info["matmul_dtype"] = str(dtype).removeprefix("torch.")
    return info


# -- 2. exactness -------------------------------------------------------------------------------
def exact_prompts(vocab: int, n: int = 8, seed: int = 1) -> list[list[int]]:
    """Prompts of 20-60 tokens sharing a 32-token prefix (prefix caching finds it), some with a
    repeated stretch (n-gram lookup finds drafts there)."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(0, vocab, (32,), generator=g).tolist()
    out = []
    for i in range(n):
        tail = torch.randint(0, vocab, (int(torch.randint(20, 60, (1,), generator=g)),), generator=g).tolist()
        if i % 2:
            tail = tail[:10] * 3
        out.append(shared + tail)
    return out


def generate(engine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Greedy outputs of all prompts run together; every KV block must come back."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                if out.error:
                    raise AssertionError(f"request {out.request_id} failed: {out.error}")
                done[out.request_id] = out.output_token_ids
    if engine.block_manager.num_used_blocks:
        raise AssertionError(f"{engine.block_manager.num_used_blocks} KV blocks still held after the run")
    return [done[i] for i in ids]


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    """Token agreement of two runs: whether all match, the share of positions that agree, and the
    first position where each pair of outputs parts (None: never)."""
    firsts = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), None if len(u) == len(v) else min(len(u), len(v)))
              for u, v in zip(a, b)]
    same = sum(x == y for u, v in zip(a, b) for x, y in zip(u, v))
    total = sum(max(len(u), len(v)) for u, v in zip(a, b))
    return {"match": all(f is None for f in firsts), "agreement": same / max(total, 1), "first_mismatch": firsts}


def exactness_section(plan: Plan, device: torch.device, log) -> dict:
    cfg = plan.shapes["smollm2-135m"]
    target = random_model(cfg, torch.device("cpu"), torch.float32, seed=0)
    vocab_map = torch.arange(min(cfg.vocab_size, 8192))
    eagle = build_eagle(target, vocab_map)  # a head of the target's own last layer: it agrees often
    target = target.to(device)
    draft = random_model(replace(cfg, num_layers=max(1, cfg.num_layers // 8), name="draft"), device, torch.float32, seed=5)
    prompts = exact_prompts(cfg.vocab_size)
    graphs = True if device.type == "cuda" else None

    def engine(spec: SpecConfig = SpecConfig(), draft_model=None, dtype="float32", cuda_graphs=graphs, model=None):
        config = EngineConfig(model="random", device=str(device), dtype=dtype, block_size=16, num_kv_blocks=512,
                              max_model_len=512, cuda_graphs=cuda_graphs,
                              scheduler=SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16), spec=spec)
        return build_engine(config, model=model if model is not None else target, draft=draft_model)

    n = plan.exact_tokens
    plain = generate(engine(), prompts, n)
    result = {"shape": cfg.name, "dtype": "float32", "prompts": len(prompts), "output_tokens": n, "cases": []}
    if device.type == "cuda":
        result["graphs_vs_eager"] = agreement(plain, generate(engine(cuda_graphs=False), prompts, n))
        log(f"  plain with graphs vs eager: match {result['graphs_vs_eager']['match']}")
    chain = dict(num_speculative_tokens=4)
    tree = dict(num_speculative_tokens=4, draft_topk=2, num_draft_tokens=6)
    cases = [("ngram chain", SpecConfig(method="ngram", **chain), None),
             ("ngram tree", SpecConfig(method="ngram", **tree), None),
             ("draft model chain", SpecConfig(method="draft", **chain), draft),
             ("draft model tree", SpecConfig(method="draft", **tree), draft),
             ("self-draft chain", SpecConfig(method="draft", **chain), target),
             ("self-draft tree", SpecConfig(method="draft", **tree), target),
             ("eagle head chain", SpecConfig(method="draft", **chain), (eagle, None, vocab_map)),
             ("eagle head tree", SpecConfig(method="draft", **tree), (eagle, None, vocab_map))]
    for name, spec, draft_model in cases:
        try:
            eng = engine(spec, draft_model)
            out = generate(eng, prompts, n)
            m = summarize(list(eng.requests.values()), 1.0)
            row = {"case": name, **agreement(plain, out), "acceptance_rate": m.get("acceptance_rate"),
                   "mean_accepted_length": m.get("mean_accepted_length"),
                   "graph_steps": getattr(eng.runner, "num_replays", None)}
        except Exception as exc:  # a failure here is a finding: keep it and go on
            row = {"case": name, "match": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=6)}
        result["cases"].append(row)
        log(f"  {name:18s} match {row['match']}" + (f"  ({row.get('error')})" if "error" in row else ""))
    if device.type == "cuda":
        bf16 = generate(engine(dtype="bfloat16", model=target.to(torch.bfloat16)), prompts, n)
        result["bfloat16_vs_float32"] = agreement(plain, bf16)
        log(f"  bfloat16 vs float32: {result['bfloat16_vs_float32']['agreement']:.1%} of positions agree")
    return result


# -- 3. step time ---------------------------------------------------------------------------------
def roofline_s(cost: CostModel, b: int, q: int, context: int) -> float:
    """Seconds of a step of b runs of q tokens after ``context`` cached ones on the roofline."""
    return cost.items_cost([(q, context, q)] * b).time_s


def steps_section(plan: Plan, device: torch.device, dtype: torch.dtype, dev_info: dict, log, deadline: float) -> dict:
    hw = roofline_hardware(dev_info, dtype)
    out = {}
    for name, cfg in plan.shapes.items():
        if time.perf_counter() > deadline:
            out[name] = {"skipped": "deadline"}
            continue
        model = random_model(cfg, device, dtype, seed=1)
        spec = ModelSpec.of(model.cfg, str(dtype).removeprefix("torch."))
        cost = CostModel(hw, spec)
        modes = ("eager", "graphs") if device.type == "cuda" else ("eager", "padded")
        shapes = [(n, 1) for n in plan.ns] + [(b, 5) for b in plan.verify_bs]
        rows = step_time_rows(model, device, shapes, plan.context, plan.reps, modes, deadline)
        for r in rows:
            r["roofline_ms"] = 1000 * roofline_s(cost, r["requests"], r["tokens_per_request"], plan.context)
        weights_gb = spec.weight_bytes_per_step / 1e9
        one = {mode: next((r for r in rows if r["mode"] == mode and r["tokens"] == 1), None) for mode in modes}
        batch1 = {f"{mode}_tok_s": 1000 / r["step_ms"] for mode, r in one.items() if r}
        roof = one["eager"]["roofline_ms"] if one["eager"] else None
        batch1.update({f"{mode}_fraction_of_roofline": roof / r["step_ms"] for mode, r in one.items() if r and roof})
        batch1["roofline_tok_s"] = 1000 / roof if roof else None
        out[name] = {"shape": cfg.name, "num_layers": cfg.num_layers, "weight_gb_per_step": weights_gb, "rows": rows,
                     "batch1": batch1}
        log(f"  {name}: batch-1 " + ", ".join(f"{k} {v:.3g}" for k, v in batch1.items() if v is not None))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


def roofline_hardware(dev_info: dict, dtype: torch.dtype) -> HardwareSpec:
    """The device as measured now, with no overhead: the roofline a step cannot beat."""
    return HardwareSpec("measured", "ceilings measured by bench/gpu/gpu_run.py", dev_info["matmul_flops_per_s"],
                        dev_info["copy_bandwidth_bytes_per_s"], float(dev_info.get("memory_bytes") or 1e12),
                        compute_efficiency=1.0, bandwidth_efficiency=1.0, default_dtype=str(dtype).removeprefix("torch."))


# -- 4. profile: whole engine steps, fitted ---------------------------------------------------
def profile_section(plan: Plan, device: torch.device, dtype: torch.dtype, log) -> tuple[dict, HardwareSpec]:
    cfg = plan.shapes["llama-3-8b"]
    model = random_model(cfg, device, dtype, seed=2, max_len=plan.profile_max_len)

    def load(name, dev, dt):  # measure()'s loader, given our model (no file, no tokenizer)
        return model, None, None

    import minispec.sim.profile as profile_module
    real_load = profile_module.load_model
    profile_module.load_model = load
    try:
        points, spec, info = measure(build_engine, cfg.name, str(device), str(dtype).removeprefix("torch."),
                                     plan.profile_batch_sizes, (0, 4), plan.profile_contexts, plan.profile_chunks,
                                     num_steps=5, max_prefill_tokens=1 << 17, progress=lambda line: log(line))
    finally:
        profile_module.load_model = real_load
    params = fit(points)
    hw = hardware_from_fit(params, info, points)
    hw = replace(hw, name=f"{_slug(info['device'])}-minispec", description=f"{info['device']}, minispec's engine "
                 f"({'CUDA graphs' if device.type == 'cuda' else 'eager'}), fitted by bench/gpu/gpu_run.py")
    log(f"  fit: bandwidth {params['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, compute {params['flops_per_s'] / 1e12:.0f} "
        f"TFLOP/s, step overhead {1000 * params['step_overhead_s']:.2f} ms, per request "
        f"{1000 * params['request_overhead_s']:.3f} ms, rms error {params['rms_rel_error']:.1%}")
    del model
    return {"params": params, "hardware": hw.to_dict()}, hw


# -- 5. the crossover ------------------------------------------------------------------------
class PricedDraft(DraftModelDrafter):
    """A draft model whose forwards run for real (their cost) while acceptance is drawn from
    ``alpha`` as the synthetic drafter draws it: random weights agree with nothing, and the
    question here is what the draft's forwards cost the batch."""

    def __init__(self, base: DraftModelDrafter, alpha: float, seed: int = 0):
        super().__init__(base.runner, base.target_vocab_size, base.vocab_map, base.confidence_threshold)
        self.acceptance = FixedAlpha(alpha, seed)

    def verify(self, scheduled, target_logits):
        return verify_synthetic(scheduled, target_logits, self.acceptance)


ARMS = [("off", None, None), ("synthetic a=0.6", 0.6, None), ("synthetic a=0.8", 0.8, None),
        ("1B draft a=0.8", 0.8, "draft")]


def crossover_prompts(plan: Plan, vocab: int, n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (plan.prompt_len,), generator=g).tolist() for _ in range(n)]


def run_wave(engine, c: int, prompts, plan: Plan) -> dict:
    """One wave of ``c`` requests at concurrency ``c`` (closed loop): throughput and speculation's
    counts over the wave; the requests are released afterwards, so one engine serves many waves."""
    params = SamplingParams(max_tokens=plan.output_len, temperature=0.0, ignore_eos=True)
    requests, wall = run_closed_loop(engine, prompts, c, c, params)
    m = summarize(requests, wall)
    failed = [r.request_id for r in requests if r.error]
    if failed:
        raise AssertionError(f"{len(failed)} requests failed, e.g. {failed[0]}: {requests[0].error}")
    for r in requests:
        engine.release(r.request_id)
    return {"concurrency": c, "throughput_tok_s": m["throughput_tok_s"], "wall_s": wall,
            "mean_accepted_length": m.get("mean_accepted_length"), "tpot_p50_ms": _ms(m.get("tpot_p50_s"))}


def _ms(seconds):
    return None if seconds is None else 1000 * seconds


def crossover_section(plan: Plan, device: torch.device, dtype: torch.dtype, fitted: HardwareSpec | None,
                      log, deadline: float) -> dict:
    cfg = plan.shapes["llama-3-8b"]
    target = random_model(cfg, device, dtype, seed=3)
    draft = random_model(plan.draft_1b, device, dtype, seed=4) if plan.draft_1b.vocab_size == cfg.vocab_size else None
    max_len = plan.prompt_len + plan.output_len + 16
    blocks = max(plan.concurrencies) * (-(-max_len // 16)) + 16
    dt = str(dtype).removeprefix("torch.")

    def config(arm) -> EngineConfig:
        _, alpha, kind = arm
        spec = SpecConfig() if alpha is None else SpecConfig(method="draft" if kind else "synthetic",
                                                             num_speculative_tokens=4, alpha=alpha)
        return EngineConfig(model="random", device=str(device), dtype=dt, block_size=16, num_kv_blocks=blocks,
                            max_model_len=max_len, enable_prefix_caching=False,
                            scheduler=SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=max(plan.concurrencies)),
                            spec=spec)

    def real(arm):
        """One engine per arm, every graph a wave needs recorded before any is timed."""
        engine = build_engine(config(arm), model=target, draft=draft if arm[2] else None)
        if arm[2]:  # the priced draft in place of the built one, in the guard the builder put it in
            engine.drafter = DrafterGuard(PricedDraft(engine.drafter.inner, arm[1]),
                                                   engine.executor.vocab_size)
        contexts = (plan.prompt_len, max_len)
        recorded = 0
        # the target decodes (1) and verifies (k + 1); a draft model catches up on 1..k + 1 tokens
        drafter = getattr(engine.drafter, "inner", None)
        for runner, queries in ((engine.runner, (1, 5)), (getattr(drafter, "runner", None),
                                                                    (1, 2, 3, 4, 5))):
            if hasattr(runner, "record_all"):
                recorded += runner.record_all(queries, max(plan.concurrencies), contexts)
        warm = Plan(plan.tiny)
        warm.output_len = 8
        run_wave(engine, 2, prompts, warm)  # cuBLAS and the allocator warmed before any timed wave
        return engine, recorded

    def simulated(arm, hardware):
        _, alpha, kind = arm
        return build_sim_engine(config(arm), hardware=hardware, model=ModelSpec.of(cfg, dt),
                                draft=ModelSpec.of(plan.draft_1b, dt) if kind else None,
                                acceptance=FixedAlpha(alpha, 0) if alpha is not None else None)

    stock = load_hardware("h200") if device.type == "cuda" else None
    prompts = crossover_prompts(plan, cfg.vocab_size, max(plan.concurrencies))
    rows = []
    for arm in ARMS:
        if arm[2] and draft is None:
            continue
        if time.perf_counter() > deadline:
            rows.append({"arm": arm[0], "skipped": "deadline"})
            continue
        t0 = time.perf_counter()
        engine, recorded = real(arm)
        log(f"  {arm[0]}: {recorded} graphs recorded and a warm-up wave in {time.perf_counter() - t0:.1f} s")
        for c in plan.concurrencies:
            if time.perf_counter() > deadline:
                rows.append({"arm": arm[0], "concurrency": c, "skipped": "deadline"})
                continue
            row = {"arm": arm[0], **run_wave(engine, c, prompts, plan)}
            for label, hw in (("sim_fitted", fitted), ("sim_stock", stock)):
                if hw is not None:
                    row[f"{label}_throughput_tok_s"] = run_wave(simulated(arm, hw), c, prompts, plan)["throughput_tok_s"]
            rows.append(row)
            log(f"  {arm[0]:16s} c={c:3d}: {row['throughput_tok_s']:8.1f} tok/s"
                + (f"  (sim fitted {row['sim_fitted_throughput_tok_s']:8.1f})" if "sim_fitted_throughput_tok_s" in row else ""))
        del engine
        if device.type == "cuda":
            torch.cuda.empty_cache()
    base = {(r["concurrency"]): r for r in rows if r["arm"] == "off" and "throughput_tok_s" in r}
    for r in rows:
        off = base.get(r["concurrency"])
        if off is None or "throughput_tok_s" not in r:
            continue
        r["speedup"] = r["throughput_tok_s"] / off["throughput_tok_s"]
        for label in ("sim_fitted", "sim_stock"):
            key = f"{label}_throughput_tok_s"
            if key in r and key in off:
                r[f"{label}_speedup"] = r[key] / off[key]
                r[f"{label}_speedup_error"] = r[f"{label}_speedup"] / r["speedup"] - 1
                r[f"{label}_throughput_error"] = r[key] / r["throughput_tok_s"] - 1
    spec_rows = [r for r in rows if r["arm"] != "off" and "sim_fitted_speedup_error" in r]
    summary = {}
    for label in ("sim_fitted", "sim_stock"):
        errs = [abs(r[f"{label}_speedup_error"]) for r in spec_rows if f"{label}_speedup_error" in r]
        if errs:
            summary[label] = {"median_abs_speedup_error": float(np.median(errs)), "max_abs_speedup_error": max(errs),
                              "points": len(errs)}
    return {"target": cfg.name, "draft": plan.draft_1b.name, "k": 4, "prompt_tokens": plan.prompt_len,
            "output_tokens": plan.output_len, "rows": rows, "sim_summary": summary}


# -- the report --------------------------------------------------------------------------------
def _slug(name: str) -> str:
    text = name.lower().replace("nvidia", "").strip()
    return "".join(ch if ch.isalnum() else "-" for ch in text).strip("-").split("-")[0] or "device"


def plot(result: dict, path: Path) -> None:
    """T(n) per shape (eager, graphs, roofline) and the crossover (measured points, simulated lines)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    colors = ["C0", "C1", "C2"]
    for color, (name, shape) in zip(colors, result.get("steps", {}).items()):
        rows = [r for r in shape.get("rows", []) if r["tokens_per_request"] == 1]
        for mode, style in (("eager", ":"), ("graphs", "-"), ("padded", "-")):
            pts = [(r["tokens"], r["step_ms"]) for r in rows if r["mode"] == mode]
            if pts:
                ax1.plot(*zip(*pts), style, marker="o", color=color, label=f"{name} {mode}")
        roof = sorted({(r["tokens"], r["roofline_ms"]) for r in rows})
        if roof:
            ax1.plot(*zip(*roof), "--", color=color, alpha=0.5, label=f"{name} roofline")
    ax1.set(xscale="log", yscale="log", xlabel="decodes per step n", ylabel="step time T(n), ms",
            title="minispec's step time on " + result["device"].get("name", "?"))
    ax1.legend(fontsize=7)
    cross = result.get("crossover", {}).get("rows", [])
    for color, arm in zip(["C1", "C2", "C3"], [a[0] for a in ARMS[1:]]):
        pts = [(r["concurrency"], r["speedup"]) for r in cross if r["arm"] == arm and "speedup" in r]
        sim = [(r["concurrency"], r["sim_fitted_speedup"]) for r in cross if r["arm"] == arm and "sim_fitted_speedup" in r]
        if pts:
            ax2.plot(*zip(*pts), "o", color=color, label=f"{arm} measured")
        if sim:
            ax2.plot(*zip(*sim), "-", color=color, alpha=0.6, label=f"{arm} simulated (fitted)")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(xscale="log", xlabel="concurrency", ylabel="throughput with speculation / without",
            title="the crossover, 8B target, k 4")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a CPU test runs this)")
    ap.add_argument("--sections", default="device,exactness,steps,profile,crossover")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip what would run past this many seconds")
    ap.add_argument("--out", default=str(RESULTS), help="folder for gpu_<device>.json and .png")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available here; use --device cpu --tiny")
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (exactness)
    torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    deadline = start + args.budget_s
    plan = Plan(args.tiny)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    result = {"date": time.strftime("%Y-%m-%d"), "command": "python -m bench gpu_run " + " ".join(argv or sys.argv[1:]),
              "tiny": args.tiny, "dtype": str(dtype).removeprefix("torch."), "seconds": {}, "errors": {}}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {line}", flush=True)

    result["device"] = device_section(device, args.tiny)
    slug = "cpu_tiny" if args.tiny and device.type == "cpu" else _slug(result["device"]["name"]) + ("_tiny" if args.tiny else "")
    json_path, png_path = out_dir / f"gpu_{slug}.json", out_dir / f"gpu_{slug}.png"
    log(f"device {result['device']['name']}: copy {result['device']['copy_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, "
        f"matmul {result['device']['matmul_flops_per_s'] / 1e12:.1f} TFLOP/s ({result['device']['matmul_dtype']})")

    def save() -> None:
        json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")

    fitted = None
    for name in sections:
        if name == "device":
            continue
        if time.perf_counter() > deadline:
            result["errors"][name] = "skipped: past the deadline"
            continue
        log(f"== {name}")
        t0 = time.perf_counter()
        try:
            if name == "exactness":
                result["exactness"] = exactness_section(plan, device, log)
            elif name == "steps":
                result["steps"] = steps_section(plan, device, dtype, result["device"], log, deadline)
            elif name == "profile":
                result["profile"], fitted = profile_section(plan, device, dtype, log)
            elif name == "crossover":
                result["crossover"] = crossover_section(plan, device, dtype, fitted, log, deadline)
            else:
                raise ValueError(f"section {name!r}: choose from device, exactness, steps, profile, crossover")
        except Exception as exc:
            result["errors"][name] = traceback.format_exc(limit=8)
            log(f"  {name} failed: {type(exc).__name__}: {exc}")
        result["seconds"][name] = round(time.perf_counter() - t0, 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()
    result["seconds"]["total"] = round(time.perf_counter() - start, 1)
    save()
    try:
        plot(result, png_path)
    except Exception as exc:
        result["errors"]["plot"] = f"{type(exc).__name__}: {exc}"
        save()
    print_summary(result)
    log(f"wrote {json_path} and {png_path}")
    return 0


def print_summary(result: dict) -> None:
    """The headline numbers as tables."""
    ex = result.get("exactness")
    if ex:
        print("\nexactness (float32, greedy, prefix caching on): " + ", ".join(
            f"{c['case']} {'ok' if c['match'] else 'MISMATCH'}" for c in ex["cases"]))
        if "bfloat16_vs_float32" in ex:
            print(f"bfloat16 against float32: {ex['bfloat16_vs_float32']['agreement']:.1%} of positions agree")
    steps = result.get("steps", {})
    if steps:
        print("\nbatch-1 decode      | eager tok/s | graphs tok/s | roofline tok/s | graphs / roofline")
        for name, s in steps.items():
            b = s.get("batch1", {})
            fmt = lambda v, f: (f % v) if isinstance(v, (int, float)) else "-"  # noqa: E731
            print(f"{name:19s} | {fmt(b.get('eager_tok_s'), '%11.0f')} | {fmt(b.get('graphs_tok_s'), '%12.0f')} | "
                  f"{fmt(b.get('roofline_tok_s'), '%14.0f')} | {fmt(b.get('graphs_fraction_of_roofline'), '%17.2f')}")
    cross = result.get("crossover", {}).get("rows", [])
    if cross:
        print("\narm              |   c | tok/s     | speedup | sim (fitted) | error  | sim (stock h200) | error")
        for r in cross:
            if "speedup" not in r:
                continue
            print(f"{r['arm']:16s} | {r['concurrency']:3d} | {r['throughput_tok_s']:9.1f} | {r['speedup']:7.2f} | "
                  f"{r.get('sim_fitted_speedup', float('nan')):12.2f} | {r.get('sim_fitted_speedup_error', float('nan')):+6.1%} | "
                  f"{r.get('sim_stock_speedup', float('nan')):16.2f} | {r.get('sim_stock_speedup_error', float('nan')):+6.1%}")
        print(json.dumps(result["crossover"].get("sim_summary", {})))
    if result.get("errors"):
        print("\nerrors:", json.dumps({k: v.splitlines()[-1] for k, v in result["errors"].items()}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
