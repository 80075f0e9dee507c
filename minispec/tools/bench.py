"""Benchmark sweeps: spec settings x concurrency (x prefix caching), a table for people and JSON rows.

Every row of a sweep runs in the same process on the same weights, and speculation is reported
as a ratio against spec off at the same concurrency and prefix-caching setting
(``speedup_vs_off``), because absolute numbers on a shared machine drift. Each row starts with an
empty prefix cache (after its warm-up request), as a freshly started server does, and reports
``prefix_caching`` and ``prefix_cache_hit_rate``. The simulator produces rows of the same shape.
With lanes (``--lanes interactive=0.15``) or routes a row also holds each lane's and route's own
metrics under the row's keys (``lanes``: {"interactive": {...}, "bulk": {...}}, ``routes``), and
the table prints them under the row: a premium lane's TPOT and the bulk lane's throughput are two
answers, not one. Taught in notebooks/05_messenger_vs_truck.ipynb and notebooks/07_policies.ipynb.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from typing import Callable

from tqdm.auto import tqdm

from minispec.base.config import SpecConfig
from minispec.tools.summary import StepLog, summarize
from minispec.core.request import SamplingParams
from minispec.tools.workload import run_closed_loop, run_poisson

ROW_KEYS = ("spec", "k", "draft_topk", "num_draft_tokens", "policy", "concurrency", "qps", "num_requests",
            "throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "itl_p99_s",
            "goodput_rps", "acceptance_rate", "mean_accepted_length", "speedup_vs_off", "wall_s")


def spec_configs(methods: str, k: int = 4, policy: str = "always", draft: str | None = None,
                 alpha: float = 0.6, draft_confidence_threshold: float = 0.0, draft_topk: int = 1,
                 num_draft_tokens: int | None = None) -> list[SpecConfig]:
    """"off,ngram,synthetic" -> one SpecConfig per method, sharing k, policy, draft, alpha, the
    draft confidence threshold and the draft tree's shape (``draft_topk``, ``num_draft_tokens``)."""
    return [SpecConfig(method=m.strip(), num_speculative_tokens=k, policy=policy, draft_model=draft,
                       alpha=alpha, draft_confidence_threshold=draft_confidence_threshold,
                       draft_topk=draft_topk, num_draft_tokens=num_draft_tokens)
            for m in methods.split(",") if m.strip()]


def bench_rows(make_engine: Callable[..., object], specs: list[SpecConfig], concurrencies: list[int],
               num_requests: int, prompts: list, params: SamplingParams, qps: list[float] | None = None,
               ttft_slo_s: float | None = None, tpot_slo_s: float | None = None, warmup: bool = True,
               lane_of=None, progress: bool = True, extra: dict | None = None,
               repeats: int = 1, prefix_caching: list[bool] | None = None, route_of=None,
               opt_out_routes: tuple[str, ...] = ()) -> list[dict]:
    """Run every (spec, concurrency) pair (or (spec, qps) for Poisson arrivals) on a fresh engine,
    for each prefix-caching setting when ``prefix_caching`` lists them.

    The runs are interleaved: at each load, every prefix-caching setting and within it every spec
    setting runs one after the other (spec off first when present), so each ``speedup_vs_off``
    compares neighbouring runs, not runs minutes apart on a machine whose speed drifts. With
    ``repeats`` > 1 the whole sweep runs that many times; each row then holds the median throughput
    and speedup, and ``speedup_min`` / ``speedup_max`` give their spread.

    Args:
        make_engine: SpecConfig -> a new Engine (fresh KV pool, same weights); with
            ``prefix_caching`` given it is called as ``make_engine(spec, prefix_caching=flag)``.
        prompts: anything ``Engine.add_request`` accepts, used round-robin.
        params: sampling parameters for every request.
        lane_of: i -> the lane of request i (None: every request interactive); with it each row
            holds ``lanes``: {lane: that lane's metrics under the row's keys} (``group_metrics``).
        route_of: i -> the route of request i (a prompt set, a traffic class), or None; with it
            each row holds ``routes`` the same way. ``opt_out_routes``: routes whose requests set
            ``num_speculative_tokens=0`` (a per-request opt-out, as a JSON route's would).
        repeats: sweeps to run (>= 1).
        prefix_caching: the settings to run, e.g. [False, True]; None: the engines' own.
    Returns: JSON-ready rows with ``ROW_KEYS`` (plus ``prefix_caching``, ``prefix_cache_hit_rate``
        and ``extra``), speedups filled in.
    Raises: ValueError for repeats < 1.
    """
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be an integer >= 1")
    loads = [("qps", q) for q in qps] if qps else [("concurrency", c) for c in concurrencies]
    specs = sorted(specs, key=lambda spec: spec.enabled)  # spec off first at every load (a stable sort)
    caching = [None] if prefix_caching is None else list(prefix_caching)
    runs = []
    bar = tqdm(total=repeats * len(caching) * len(specs) * len(loads) * num_requests, desc="bench",
               disable=not progress)
    for repeat in range(repeats):
        for kind, load in loads:
            for flag in caching:
                for spec in specs:
                    engine = make_engine(spec) if flag is None else make_engine(spec, prefix_caching=flag)
                    row = _bench_one(engine, spec, kind, load, num_requests, prompts, params, ttft_slo_s,
                                     tpot_slo_s, warmup, Traffic(lane_of, route_of, tuple(opt_out_routes)),
                                     bar)
                    runs.append({**row, "repeat": repeat, **(extra or {})})
    bar.close()
    add_speedups(runs)
    if repeats > 1:
        return _median_rows(runs)
    for r in runs:
        del r["repeat"]
    return runs


@dataclass(frozen=True)
class Traffic:
    """Who request i is: its lane (``lane_of``, None: interactive) and route (``route_of``, None:
    one route), and the routes that opt out of speculation."""

    lane_of: Callable[[int], str] | None = None
    route_of: Callable[[int], str] | None = None
    opt_out_routes: tuple[str, ...] = ()

    def lane(self, i: int) -> str:
        return self.lane_of(i) if self.lane_of else "interactive"

    def params(self, params: SamplingParams) -> Callable[[int], SamplingParams]:
        """i -> request i's sampling parameters: ``params``, with k = 0 on an opted-out route."""
        off = replace(params, num_speculative_tokens=0)
        return lambda i: off if self.route_of and self.route_of(i) in self.opt_out_routes else params

    def groups(self, requests: list) -> dict[str, dict[str, list]]:
        """{"lanes": {lane: requests}, "routes": {route: requests}} for the kinds ``requests`` (in
        the order sent) are told apart by."""
        out = {}
        for key, of in (("lanes", self.lane_of), ("routes", self.route_of)):
            if of is not None:
                by = out.setdefault(key, {})
                for i, r in enumerate(requests):
                    by.setdefault(of(i), []).append(r)
        return out


def group_metrics(requests: list, wall_s: float, ttft_slo_s: float | None = None,
                  tpot_slo_s: float | None = None) -> dict:
    """One lane's (or route's) metrics under a row's keys: its output tokens over the run's wall
    time (throughput), its TTFT / TPOT / ITL percentiles, goodput, acceptance, and its requests."""
    summary = summarize(requests, wall_s, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s)
    return {key: summary[key] for key in ROW_KEYS if key in summary}


def _bench_one(engine, spec: SpecConfig, kind: str, load, num_requests: int, prompts: list,
               params: SamplingParams, ttft_slo_s, tpot_slo_s, warmup: bool, traffic: Traffic, bar) -> dict:
    """One row: ``num_requests`` requests at one load on a fresh engine.

    The warm-up request (kernels and allocators warmed before timing) is the prefix every prompt
    of the workload shares, when there is one (a system prompt, a chat template's header): with
    prefix caching it stays cached, as on a server that has served this traffic before, and
    nothing request-specific is. Without a shared prefix the warm-up is the first prompt, and the
    cache is emptied after it: the row starts cold."""
    tokens = [engine.tokenize(p) for p in prompts]
    if warmup:
        shared = common_prefix(tokens)
        warm, _ = run_closed_loop(engine, [shared or tokens[0]], 1, 1,
                                  replace(params, max_tokens=min(4, params.max_tokens)))
        for r in warm:
            engine.release(r.request_id)
        if not shared:
            engine.reset_prefix_cache()
    step_log = engine.add_observer(StepLog())
    params_of = traffic.params(params)
    if kind == "qps":
        reqs, wall = run_poisson(engine, tokens, load, num_requests, params_of, lane_of=traffic.lane,
                                 progress=bar, wait_until=getattr(engine.clock, "advance_to", None))
    else:
        reqs, wall = run_closed_loop(engine, tokens, load, num_requests, params_of,
                                     lane_of=traffic.lane, progress=bar)
    summary = summarize(reqs, wall, step_log.stats, ttft_slo_s, tpot_slo_s)
    groups = {key: {name: group_metrics(rs, wall, ttft_slo_s, tpot_slo_s) for name, rs in by.items()}
              for key, by in traffic.groups(reqs).items()}
    return {"spec": spec.method, "k": spec.num_speculative_tokens if spec.enabled else 0,
            "draft_topk": spec.draft_topk if spec.enabled else None,
            "num_draft_tokens": spec.draft_shape.num_draft_tokens if spec.enabled else 0,
            "policy": spec.policy if spec.enabled else None,
            "concurrency": load if kind == "concurrency" else None, "qps": load if kind == "qps" else None,
            **{key: summary.get(key) for key in ROW_KEYS if key in summary},
            "mean_step_s": summary.get("mean_step_s"), "num_steps": summary.get("num_steps"),
            "decode_split": summary.get("decode_split"), "num_preemptions": summary["num_preemptions"],
            "draft_time_s": summary.get("draft_time_s"), "target_time_s": summary.get("target_time_s"),
            "prefix_caching": engine.config.enable_prefix_caching,
            "prefix_cache_hit_rate": summary.get("prefix_cache_hit_rate"), **groups}


def common_prefix(token_lists: list[list[int]]) -> list[int]:
    """The longest token prefix every list starts with ([] for none, or for a single list)."""
    if len(token_lists) < 2:
        return []
    first = token_lists[0]
    n = min(len(t) for t in token_lists)
    for i in range(n):
        if any(t[i] != first[i] for t in token_lists[1:]):
            return first[:i]
    return first[:n] if n < len(first) or any(len(t) > n for t in token_lists) else first[:n - 1]


def _median_rows(runs: list[dict]) -> list[dict]:
    """One row per (spec, k, policy, load) over repeats: the median run's numbers, with the
    median speedup and its range across repeats."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["spec"], r["k"], r.get("draft_topk"), r.get("num_draft_tokens"), r["policy"],
                           r["concurrency"], r["qps"], r.get("prefix_caching")), []).append(r)
    rows = []
    for group in groups.values():
        by_throughput = sorted(group, key=lambda r: r["throughput_tok_s"])
        row = dict(by_throughput[len(group) // 2])
        speedups = sorted(r["speedup_vs_off"] for r in group if r["speedup_vs_off"] is not None)
        if speedups:
            row["speedup_vs_off"] = statistics.median(speedups)
            row["speedup_min"], row["speedup_max"] = speedups[0], speedups[-1]
        row["num_repeats"] = len(group)
        del row["repeat"]
        rows.append(row)
    return rows


def add_speedups(rows: list[dict]) -> None:
    """speedup_vs_off = throughput / throughput of the spec-off row at the same load (and repeat and
    prefix-caching setting)."""
    def key(r):
        return r["concurrency"], r["qps"], r.get("repeat"), r.get("prefix_caching")

    base = {key(r): r["throughput_tok_s"] for r in rows if r["spec"] == "off"}
    for r in rows:
        ref = base.get(key(r))
        r["speedup_vs_off"] = r["throughput_tok_s"] / ref if ref else None


def format_table(rows: list[dict]) -> str:
    """A fixed-width table of the main columns (latencies in ms)."""
    cols = [("spec", "spec", "{}"), ("k", "k", "{}"),
            ("load", None, "{}"), ("tok/s", "throughput_tok_s", "{:.1f}"),
            ("TTFT p50 ms", "ttft_p50_s", "{:.0f}"), ("TPOT p50 ms", "tpot_p50_s", "{:.1f}"),
            ("TPOT p90 ms", "tpot_p90_s", "{:.1f}"), ("ITL p99 ms", "itl_p99_s", "{:.0f}"),
            ("goodput req/s", "goodput_rps", "{:.2f}"), ("acc rate", "acceptance_rate", "{:.2f}"),
            ("mean acc len", "mean_accepted_length", "{:.2f}"), ("speedup", "speedup_vs_off", "{:.2f}x"),
            ("prefix cache", "prefix_caching", "{}"), ("hit rate", "prefix_cache_hit_rate", "{:.2f}")]
    lines = [" | ".join(h for h, _, _ in cols)]

    def line(r: dict, load: str) -> str:
        cells = []
        for h, key, fmt in cols:
            v = load if key is None else r.get(key)
            if key is None or isinstance(v, str):
                value = v
            elif v is None:
                value = "-"
            elif isinstance(v, bool):
                value = "on" if v else "off"
            else:
                value = fmt.format(v * 1000 if key.endswith("_s") and "ms" in h else v)
            cells.append(value.rjust(len(h)))
        return " | ".join(cells)

    for r in rows:
        lines.append(line(r, f"c={r['concurrency']}" if r.get("concurrency") is not None
                          else f"qps={r['qps']}"))
        for kind in ("lanes", "routes"):  # each lane's or route's own numbers under its row
            for name, m in (r.get(kind) or {}).items():
                lines.append(line({**m, "spec": "", "k": ""}, f"{kind[:-1]} {name}"))
    return "\n".join(lines)


def write_json(rows: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)


def plot_rows(rows: list[dict], path: str, title: str | None = None) -> None:
    """Throughput and p50 TPOT against concurrency, one line per spec setting, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for spec in dict.fromkeys(r["spec"] for r in rows):
        rs = [r for r in rows if r["spec"] == spec and r.get("concurrency") is not None]
        xs = [r["concurrency"] for r in rs]
        a.plot(xs, [r["throughput_tok_s"] for r in rs], marker="o", label=spec)
        b.plot(xs, [(r["tpot_p50_s"] or 0) * 1000 for r in rs], marker="o", label=spec)
    for ax, ylabel in ((a, "throughput (tokens/s)"), (b, "p50 TPOT (ms/token)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Speculation against batching: throughput and per-token latency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
