"""One runner per published table: each point's conditions, run on the simulator.

Every runner reads its table's numbers and conditions from data/published/ (minispec/sim/
published.py) and returns one :class:`~minispec.sim.published.PointResult` per point. The
simulations are the course's own: ``build_sim_engine`` with the shared scheduler, a closed loop
(``concurrency`` requests in flight) or Poisson arrivals, constant prompt and output lengths
unless the source gives them per request. Acceptance comes from the source when it publishes it;
otherwise alpha is fitted to the one point the table marks ``fit`` (bisection on the simulated
speedup, which rises with alpha) and every other point is predicted with it.
Invariant: a runner never adjusts anything per point; hardware, engine mode and models are the
data files' (data/hardware/, data/models/).
Taught in notebooks/05_messenger_vs_truck.ipynb (``course.published``).
"""

from __future__ import annotations

import random

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import SamplingParams
from minispec.sim.executor import build_sim_engine
from minispec.sim.published import PointResult, load_table, point
from minispec.speculation.acceptance import FixedAlpha, alpha_for_accepted_length
from minispec.tools.workload import run_closed_loop, run_poisson

OFF = SpecConfig()


def run(hardware, model: str, spec: SpecConfig = OFF, draft=None, concurrency: int | None = None,
        qps: float | None = None, num_requests: int = 64, prompt_len=512, output_len=128,
        weight_dtype: str | None = None, tensor_parallel_size: int = 1,
        draft_tensor_parallel_size: int | None = None, max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192, max_model_len: int | None = None,
        memory_utilization: float = 0.9, seed: int = 0) -> dict:
    """One simulated serving run: ``summarize``'s metrics (throughput_tok_s, e2e_mean_s,
    tpot_p50_s, ...) plus the step log's totals.

    Args:
        hardware: a name ("h100", "h100@sglang-0.5-cuda-graphs") or a HardwareSpec.
        spec: speculation (method "draft" with ``draft`` a model, a head or "ngram").
        concurrency, qps: a closed loop of that many requests in flight, or Poisson arrivals.
        prompt_len, output_len: tokens per request, or one list entry per request.
        weight_dtype: e.g. "fp8" for fp8 weights; the KV cache stays bf16 either way.
    Raises: ValueError when neither or both of ``concurrency`` and ``qps`` are given, and as
        ``build_sim_engine``.
    """
    if (concurrency is None) == (qps is None):
        raise ValueError(f"concurrency={concurrency}, qps={qps}: give exactly one load")
    config = EngineConfig(model=model, seed=seed, enable_prefix_caching=False,
                          max_model_len=max_model_len, spec=spec,
                          scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens,
                                                    max_num_seqs=max_num_seqs))
    engine = build_sim_engine(config, hardware=hardware, model=model, draft=draft, weight_dtype=weight_dtype,
                              kv_dtype="bfloat16", memory_utilization=memory_utilization,
                              acceptance=FixedAlpha(spec.alpha, seed=seed),
                              tensor_parallel_size=tensor_parallel_size,
                              draft_tensor_parallel_size=draft_tensor_parallel_size)
    log = engine.add_observer(StepLog())
    prompts = [[0] * n for n in prompt_len] if isinstance(prompt_len, list) else [[0] * prompt_len]
    outs = output_len if isinstance(output_len, list) else [output_len]
    params = lambda i: SamplingParams(max_tokens=outs[i % len(outs)], temperature=0.0,  # noqa: E731
                                      ignore_eos=True)
    if qps is None:
        reqs, wall = run_closed_loop(engine, prompts, concurrency, num_requests, params)
    else:
        reqs, wall = run_poisson(engine, prompts, qps, num_requests, params, seed=seed,
                                 wait_until=engine.clock.advance_to)  # idle on the virtual clock, not a sleep
    return summarize(reqs, wall, log.stats)


def fit_alpha(speedup_at, target: float, lo: float = 0.05, hi: float = 0.98) -> float:
    """The alpha at which ``speedup_at(alpha)`` (rising with alpha) equals ``target``, by
    bisection to 0.002; the nearer end of [lo, hi] when the target is out of reach."""
    if speedup_at(hi) <= target:
        return hi
    if speedup_at(lo) >= target:
        return lo
    while hi - lo > 0.002:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup_at(mid) < target else (lo, mid)
    return (lo + hi) / 2


def _result(table: dict, point_id: str, simulated: float, x=None, label: str = "") -> PointResult:
    p = point(table, point_id)
    return PointResult(table["table"], point_id, p["quantity"], p["published"], simulated, bool(p.get("fit")),
                       x, label or p.get("text", point_id))


# -- SpecDecode-Bench (arXiv 2601.11580): vLLM 0.10, H100, k = 3 --------------------------------
def specdecode_bench(table: dict) -> list[PointResult]:
    """The EAGLE speedup at batch 128 (GSM8K), the loss of speedup from batch 1 to 32 (ShareGPT,
    8B on one GPU and 70B on four), and drafting over verification time of a draft model."""
    alpha = alpha_for_accepted_length(table["acceptance"]["mean_accepted_length_k3"], 3)
    spec = SpecConfig(method="draft", num_speculative_tokens=3, alpha=alpha)
    loads = table["workloads"]

    def speedup(model, batch, dataset, tp=1):
        wl = loads[dataset]
        n = max(2 * batch, 32)
        common = dict(concurrency=batch, num_requests=n, prompt_len=wl["prompt_len"],
                      output_len=wl["output_len"], tensor_parallel_size=tp)
        on = run("h100", model, spec, draft="eagle-head", **common)
        return on["throughput_tok_s"] / run("h100", model, **common)["throughput_tok_s"]

    out = []
    c = point(table, "8b_gsm8k_b128")["conditions"]
    out.append(_result(table, "8b_gsm8k_b128", speedup(c["model"], c["batch"], c["dataset"]), c["batch"],
                       "Llama-3.1-8B, GSM8K, EAGLE k 3, batch 128"))
    for pid, label in (("8b_sharegpt_b32_over_b1", "Llama-3.1-8B, ShareGPT: speedup at 32 over at 1"),
                       ("70b_sharegpt_b32_over_b1",
                        "Llama-3-70B on 4 GPUs, ShareGPT: speedup at 32 over at 1")):
        c = point(table, pid)["conditions"]
        tp = c.get("tensor_parallel_size", 1)
        s1, s32 = (speedup(c["model"], b, c["dataset"], tp) for b in c["batches"])
        out.append(_result(table, pid, s32 / s1, None, label))
    for pid in ("8b_draft_target_ratio", "70b_draft_target_ratio"):
        c = point(table, pid)["conditions"]
        tp = c.get("tensor_parallel_size", 1)
        engine = build_sim_engine(EngineConfig(model=c["model"],
                                               spec=SpecConfig(method="draft", num_speculative_tokens=3)),
                                  hardware="h100", draft=c["draft"], tensor_parallel_size=tp)
        cm, context = engine.cost_model, loads["sharegpt"]["prompt_len"]
        # verification: the target's forward over the verify rows, without the engine step's host work
        verify_s = cm.uniform_decode_time_s(1, context, 3) - cm.draft_time_s([1], [context], [3]) \
            - cm.hardware.step_overhead_s
        out.append(_result(table, pid, cm.draft_time_s([1], [context], [3]) / verify_s, None,
                           f"{c['model']} with {c['draft']}: drafting over verification time"))
    return out


# -- GPUStack: Qwen3-8B latency on one H100 (vLLM bf16 against SGLang fp8 + EAGLE-3 tree) -----
def gpustack_qwen3_8b_h100(table: dict) -> list[PointResult]:
    """Mean latency per request of the baseline and the optimized server at BS = 1, 2, 4, 8, and
    their ratio; alpha of the EAGLE-3 tree (4 deep, top 4, 16 nodes) fitted at BS = 1."""
    wl = table["workload"]
    common = dict(num_requests=wl["num_requests"], prompt_len=wl["prompt_len"], output_len=wl["output_len"])
    batches = [1, 2, 4, 8]
    base = {b: run("h100", "qwen3-8b", concurrency=b, **common)["e2e_mean_s"] for b in batches}

    def optimized(b, alpha):
        spec = SpecConfig(method="draft", num_speculative_tokens=4, draft_topk=4,
                          num_draft_tokens=16, alpha=alpha)
        return run("h100@sglang-0.5-cuda-graphs", "qwen3-8b", spec, draft="eagle3-head", concurrency=b,
                   weight_dtype="fp8", **common)["e2e_mean_s"]

    fit = point(table, "speedup_bs1")
    alpha = fit_alpha(lambda a: base[1] / optimized(1, a), fit["published"])
    opt = {b: optimized(b, alpha) for b in batches}
    out = [_result(table, f"speedup_bs{b}", base[b] / opt[b], b, f"BS={b}: speedup (alpha {alpha:.3f})")
           for b in batches]
    out += [_result(table, f"baseline_latency_bs{b}", base[b], b, f"BS={b}: vLLM bf16 mean latency")
            for b in batches]
    out += [_result(table, f"optimized_latency_bs{b}", opt[b], b,
                    f"BS={b}: SGLang fp8 + EAGLE-3 mean latency")
            for b in batches]
    return out


# -- vLLM blog, October 2024: Llama3-70B on 4 x H100, QPS 1 against saturation -----------------
def vllm_blog_2024(table: dict) -> list[PointResult]:
    """Mean TPOT of spec off over speculation at QPS 1 (Poisson) and saturated (a closed loop at
    max_num_seqs); alpha fitted per dataset at QPS 1 (the data file lists the assumptions)."""
    lengths = {"sharegpt": (233, 221), "cnn_dailymail": (1024, 128)}
    drafts = {"qwama-0.5b": ("qwama-0.5b", 1), "ngram": ("ngram", None)}
    k, saturated = 4, 256
    out = []
    for qps_id, high_id in (("sharegpt_draft_qps1", "sharegpt_draft_high_qps"),
                            ("cnn_ngram_qps1", "cnn_ngram_high_qps")):
        c = point(table, qps_id)["conditions"]
        prompt_len, output_len = lengths[c["dataset"]]
        draft, draft_tp = drafts[c["drafter"]]

        low = dict(qps=c["qps"], num_requests=48)
        high = dict(concurrency=saturated, num_requests=2 * saturated)
        off = {}  # spec off does not depend on alpha: one run per load

        def tpot_speedup(alpha, load):
            common = dict(prompt_len=prompt_len, output_len=output_len, tensor_parallel_size=4, **load)
            key = "qps" in load
            if key not in off:
                off[key] = run("h100", "llama-3-70b", **common)["tpot_mean_s"]
            spec = SpecConfig(method="draft", num_speculative_tokens=k, alpha=alpha)
            return off[key] / run("h100", "llama-3-70b", spec, draft=draft,
                                  draft_tensor_parallel_size=draft_tp, **common)["tpot_mean_s"]

        alpha = fit_alpha(lambda a: tpot_speedup(a, low), point(table, qps_id)["published"])
        out.append(_result(table, qps_id, tpot_speedup(alpha, low), c["qps"],
                           f"{c['dataset']}, {c['drafter']}: QPS 1 (alpha {alpha:.3f})"))
        out.append(_result(table, high_id, tpot_speedup(alpha, high), None,
                           f"{c['dataset']}, {c['drafter']}: saturated"))
    return out


# -- nano-vllm README: Qwen3-0.6B on an RTX 4070 Laptop, 256 requests at once ------------------
def nano_vllm(table: dict) -> list[PointResult]:
    """Output tokens/s of bench.py's workload, replayed with its own seeded lengths."""
    rng = random.Random(0)  # bench.py: seed(0), then prompts of randint(100, 1024) ids, then output lengths
    prompts = [len([rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))]) for _ in range(256)]
    outputs = [rng.randint(100, 1024) for _ in range(256)]
    tok_s = run("rtx4070-laptop", "qwen3-0.6b", concurrency=256, num_requests=256, prompt_len=prompts,
                output_len=outputs, max_num_seqs=512, max_num_batched_tokens=16384,
                max_model_len=4096)["throughput_tok_s"]
    return [_result(table, pid, tok_s, None, label) for pid, label in
            (("nano_vllm_throughput", "nano-vllm, Qwen3-0.6B, RTX 4070 Laptop"),
             ("vllm_throughput", "vLLM, Qwen3-0.6B, RTX 4070 Laptop"))]


# -- decode step times on one H100 (GPUStack spec-off runs; Hazy Research's megakernel) --------
def step_times_h100(table: dict) -> list[PointResult]:
    """Median TPOT of spec-off serving runs under each engine mode."""
    wl = load_table("gpustack_qwen3_8b_h100")["workload"]
    out = []
    for p in table["points"]:
        c = p["conditions"]
        hardware = f"h100@{c['engine']}"
        if c.get("model") == "llama-3.2-1b":  # the megakernel post: a 32-token prompt, 128 tokens generated
            tpot = run(hardware, "llama-3.2-1b", concurrency=1, num_requests=1, prompt_len=32, output_len=128)
        else:
            tpot = run(hardware, "qwen3-8b", concurrency=c["batch"], num_requests=wl["num_requests"],
                       prompt_len=wl["prompt_len"], output_len=wl["output_len"],
                       weight_dtype=c["weight_dtype"])
        out.append(_result(table, p["id"], tpot["tpot_p50_s"], c["batch"],
                           f"{c['engine']}, {c.get('model', 'qwen3-8b')} "
                           f"{c.get('weight_dtype', 'bfloat16')}, batch {c['batch']}"))
    return out


TABLES = {"specdecode_bench": specdecode_bench, "gpustack_qwen3_8b_h100": gpustack_qwen3_8b_h100,
          "vllm_blog_2024": vllm_blog_2024, "nano_vllm": nano_vllm, "step_times_h100": step_times_h100}


def reproduce(name: str) -> list[PointResult]:
    """Simulate every point of the published table ``name`` (data/published/NAME.json).

    Raises: ValueError for an unknown table.
    """
    if name not in TABLES:
        raise ValueError(f"published table {name!r} has no runner: choose one of {', '.join(sorted(TABLES))}")
    return TABLES[name](load_table(name))
