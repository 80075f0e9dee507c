"""Simulated benchmark sweeps: bench's own rows (same keys, same speedup column) on a virtual clock.

``sweep`` is the notebooks' fast entry point (sliders call it); ``simulate`` on the command line
uses the same ``sim_rows``. Both call ``minispec.tools.bench.bench_rows`` with a factory of simulated
engines, so closed-loop and Poisson workloads, metrics and speedups are the real benchmark's code.
Simulated prompts are placeholders (each token id a route's index), so every prompt of a route
would share all its blocks with the others: ``sweep``, and ``simulate`` unless told otherwise, run
with prefix caching off. A shared-prefix workload needs real token ids (``simulate --prompts``).
Invariant: a sweep with the same arguments and seed returns the same rows.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

from minispec.tools.bench import bench_rows, spec_configs
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.core.request import SamplingParams
from minispec.speculation.acceptance import FixedAlpha, RouteAlpha, alpha_for_accepted_length, parse_routes
from minispec.sim.executor import build_sim_engine
from minispec.tools.workload import lanes_by_share, parse_lanes


def route_prompts(prompt_len: int, mix: list[str], routes: list[str]) -> list[list[int]]:
    """Token-id prompts of ``prompt_len`` tokens, one per entry of ``mix``; each token id is the
    route's index in ``routes`` (so ``RouteAlpha`` can tell routes apart; the ids mean nothing, and
    prompts of one route are all alike: run them with prefix caching off)."""
    if prompt_len < 1:
        raise ValueError(f"prompt_len={prompt_len}: must be >= 1 token")
    return [[routes.index(name)] * prompt_len for name in mix]


def sim_rows(config: EngineConfig, specs: list[SpecConfig], concurrencies: list[int], num_requests: int,
             prompts: list, max_tokens: int, hardware="h100", model=None, draft=None, acceptance_factory=None,
             qps: list[float] | None = None, ttft_slo_s: float | None = None, tpot_slo_s: float | None = None,
             weight_dtype: str | None = None, kv_dtype: str | None = None, draft_kv_window: int | None = None,
             memory_utilization: float = 0.9, tokenizer=None, progress: bool = False,
             prefix_caching: list[bool] | None = None, warmup: bool = False, tensor_parallel_size: int = 1,
             draft_tensor_parallel_size: int | None = None, lane_of=None, route_of=None,
             opt_out_routes: tuple[str, ...] = ()) -> list[dict]:
    """bench rows for simulated engines, one fresh engine per (spec, load) and prefix-caching setting.

    Args:
        config: base engine config (scheduler, block size, seed); each spec replaces its ``spec``.
        prompts: token-id lists (or text / chat prompts when ``tokenizer`` is given).
        max_tokens: output tokens per request (requests ignore EOS, as in bench --ignore-eos).
        acceptance_factory: SpecConfig -> acceptance model; None uses FixedAlpha(spec.alpha).
        prefix_caching: the settings to sweep (e.g. [False, True]); None: ``config``'s.
        warmup: run bench's warm-up request first, as the real bench does (it leaves the prefix
            every prompt shares cached; needed to compare hit rates with a real run).
        lane_of, route_of, opt_out_routes: lanes and routes of the requests (see ``bench_rows``):
            each row then holds every lane's and route's own metrics.
        Other arguments: see ``build_sim_engine`` and ``bench_rows``.
    Returns: bench's rows plus ``hardware``, ``engine_mode``, ``model``, ``draft`` and ``simulated: True``.
    """
    def make_engine(spec: SpecConfig, prefix_caching: bool = config.enable_prefix_caching):
        acceptance = acceptance_factory(spec) if acceptance_factory else None
        return build_sim_engine(replace(config, spec=spec, enable_prefix_caching=prefix_caching),
                                hardware=hardware, model=model, draft=draft, acceptance=acceptance,
                                weight_dtype=weight_dtype, kv_dtype=kv_dtype, draft_kv_window=draft_kv_window,
                                memory_utilization=memory_utilization, tokenizer=tokenizer,
                                tensor_parallel_size=tensor_parallel_size,
                                draft_tensor_parallel_size=draft_tensor_parallel_size)

    probe = make_engine(specs[0])
    executor = probe.executor
    extra = {"hardware": executor.cost_model.hardware.name,
             "engine_mode": executor.cost_model.hardware.engine_mode,
             "model": executor.cost_model.target.name,
             "draft": str(draft) if any(s.method == "draft" for s in specs) and draft else None,
             "weight_dtype": executor.cost_model.target.weight_dtype, "simulated": True}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return bench_rows(make_engine, specs, concurrencies, num_requests, prompts, params, qps=qps,
                      ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s, warmup=warmup, progress=progress,
                      extra=extra, prefix_caching=prefix_caching, lane_of=lane_of, route_of=route_of,
                      opt_out_routes=opt_out_routes)


def sweep(hardware="h100", model: str = "llama-3-8b", draft: str | None = "llama-3.2-1b",
          alpha: float = 0.8, k: int = 4, concurrency=(1, 4, 16, 64), policy: str = "always",
          methods: str | None = None, num_requests: int = 200, prompt_len: int = 512, max_tokens: int = 64,
          qps=None, routes: str | None = None, weight_dtype: str | None = None, kv_dtype: str | None = None,
          draft_kv_window: int | None = None, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
          seed: int = 0, acceptance_length: float | None = None, tensor_parallel_size: int = 1,
          lanes: float | str | None = None, opt_out_routes: tuple[str, ...] = ()) -> list[dict]:
    """Simulate spec off against speculation over a concurrency (or QPS) sweep; returns bench rows.

    Fast enough for a slider: a few hundred requests take a fraction of a second per row.

    Args:
        hardware: a name in data/hardware/ ("h100", "h100@megakernel") or a HardwareSpec (e.g.
            ``load_hardware("h100").with_overheads(step_overhead_s=...)`` for an overhead slider).
        model, draft: names in data/models/ (draft None = synthetic); the draft may be a head sized
            from the target ("eagle-head", "eagle3-head", "mtp") or "ngram" (free).
        alpha: per-position acceptance probability; ``routes`` ("chat=0.8:3,json=0.3") overrides it per route.
        acceptance_length: a mean accepted length (bonus included) at this k; alpha is solved from it.
        tensor_parallel_size: GPUs the target (and drafter) are split over.
        k: draft tokens per verify; policy: any ``make_policy`` spelling ("always", "goodput", ...).
        methods: comma-separated spec methods; default "off,draft" with a draft, else "off,synthetic".
        prompt_len, max_tokens: tokens in and out per request.
        lanes: the interactive lane's share of the requests (0.15, or "interactive=0.15"); None:
            every request interactive. Rows then hold each lane's metrics (``lanes``); with
            ``routes`` they hold each route's (``routes``), and ``opt_out_routes`` decode plainly.
    Raises: ValueError for bad names or values (from the configs and loaders).
    """
    if acceptance_length is not None:
        alpha = alpha_for_accepted_length(acceptance_length, k)
    methods = methods or ("off,draft" if draft else "off,synthetic")
    specs = spec_configs(methods, k, policy, draft, alpha)
    config = EngineConfig(model=model, seed=seed, enable_prefix_caching=False, scheduler=SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs))
    route_of = None
    if routes:
        alphas, mix = parse_routes(routes)
        prompts = route_prompts(prompt_len, mix, list(alphas))
        factory = lambda spec: RouteAlpha(alphas, seed=seed)  # noqa: E731
        route_of = routes_in_turn(mix)
    else:
        prompts = route_prompts(prompt_len, ["all"], ["all"])
        factory = lambda spec: FixedAlpha(spec.alpha, seed=seed)  # noqa: E731
    if opt_out_routes and route_of is None:
        raise ValueError(f"opt_out_routes={opt_out_routes!r}: name routes first "
                         "(routes=\"chat=0.8:3,json=0.3:1\")")
    share = parse_lanes(lanes) if isinstance(lanes, str) else lanes
    conc = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    qps_list = None if qps is None else ([qps] if isinstance(qps, (int, float)) else list(qps))
    return sim_rows(config, specs, conc, num_requests, prompts, max_tokens, hardware=hardware, model=model,
                    draft=draft, acceptance_factory=factory, qps=qps_list, weight_dtype=weight_dtype,
                    kv_dtype=kv_dtype, draft_kv_window=draft_kv_window,
                    tensor_parallel_size=tensor_parallel_size,
                    lane_of=None if share is None else lanes_by_share(share), route_of=route_of,
                    opt_out_routes=tuple(opt_out_routes))


def routes_in_turn(mix: list[str]):
    """``route_of(i)`` for requests that take ``route_prompts``' prompts round-robin: mix[i % len(mix)]."""
    return lambda i: mix[i % len(mix)]
