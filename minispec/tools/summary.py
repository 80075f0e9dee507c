"""A run's metrics from its requests' counters and its steps: what bench rows, the course and
the simulator's sweeps print.

Definitions (per request: ``minispec.core.support.metrics``):
- throughput: output tokens / wall time (tokens/s).
- goodput: requests/s that finished and met every SLO the caller set (TTFT and TPOT), as in
  DistServe (Zhong et al. 2024); SmartSpec's token-rate goodput is a different quantity.
- prefix cache hit rate: tokens found in the prefix cache / tokens looked up, summed over
  admissions (a request's prompt when it is admitted; its prompt and output again if it is
  re-admitted after a preemption), as vLLM counts prefix cache hits and queries.
- percentiles: linear interpolation between the two nearest values (p50, p90, p99).
Taught in notebooks/00_quickstart.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from minispec.core.request import Request, RequestStatus
from minispec.core.support.metrics import StepStats, request_metrics


class StepLog:
    """An engine observer that keeps every step's StepStats: ``log = engine.add_observer(StepLog())``."""

    def __init__(self):
        self.stats: list[StepStats] = []

    def __call__(self, record) -> None:
        self.stats.append(record.stats)

    def clear(self) -> None:
        self.stats.clear()


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated q-th percentile (0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def meets_slo(m: dict, ttft_slo_s: float | None, tpot_slo_s: float | None) -> bool:
    """True for a finished request whose TTFT and TPOT are within the SLOs (None = no SLO)."""
    if m["status"] not in (RequestStatus.FINISHED_STOPPED.value, RequestStatus.FINISHED_LENGTH.value):
        return False
    if ttft_slo_s is not None and (m["ttft_s"] is None or m["ttft_s"] > ttft_slo_s):
        return False
    if tpot_slo_s is not None and m["tpot_s"] is not None and m["tpot_s"] > tpot_slo_s:
        return False
    return True


def decode_step_split(steps: list[StepStats]) -> dict | None:
    """Mean seconds of the decode-only steps of a run (no prompt tokens in them), split as the engine
    times them: the whole step (``step_s``), the draft's forwards (``draft_s``), the target's forward
    (``target_s``) and the rest (``other_s``: scheduling, sampling, verify bookkeeping), with the mean
    decodes and draft rows per step. Two runs' splits, one plain and one with speculating
    neighbours, say what a plain request waited for: the drafter's sequential forwards, or the
    verify rows that widened the target's forward. None when no step decoded alone."""
    decode = [s for s in steps if s.num_prefill_tokens == 0 and s.num_decodes > 0]
    if not decode:
        return None
    n = len(decode)
    return {**step_split(decode), "num_decodes": sum(s.num_decodes for s in decode) / n,
            "num_draft_rows": sum(s.num_draft_proposed for s in decode) / n}


def step_split(steps: list[StepStats]) -> dict:
    """Mean seconds per step of ``steps`` (every one): the whole step (``step_s``), the draft's
    forwards (``draft_s``), the target's forward (``target_s``) and the rest (``other_s``)."""
    n = max(len(steps), 1)
    step, draft, target = (sum(getattr(s, key) for s in steps) / n
                           for key in ("duration_s", "draft_time_s", "target_time_s"))
    return {"num_steps": len(steps), "step_s": step, "draft_s": draft, "target_s": target,
            "other_s": max(step - draft - target, 0.0)}


def latency_stats(metrics: list[dict], wall_s: float, ttft_slo_s: float | None = None,
                  tpot_slo_s: float | None = None) -> dict:
    """What the finished requests among ``metrics`` (``request_metrics`` rows) did in ``wall_s``
    seconds: counts, throughput (tokens/s, requests/s), goodput under the SLOs, and the p50, p90,
    p99 and mean of TTFT, TPOT, ITL and E2E (seconds; None where no request measured one).
    ``summarize`` and the HTTP client's ``summarize_records`` share it."""
    done = [m for m in metrics if m["e2e_s"] is not None]
    wall = max(wall_s, 1e-12)
    out = {"num_finished": len(done), "num_output_tokens": sum(m["num_output_tokens"] for m in done),
           "wall_s": wall_s, "throughput_tok_s": sum(m["num_output_tokens"] for m in done) / wall,
           "request_throughput_rps": len(done) / wall,
           "goodput_rps": sum(meets_slo(m, ttft_slo_s, tpot_slo_s) for m in done) / wall}
    series = {"ttft": [m["ttft_s"] for m in done if m["ttft_s"] is not None],
              "tpot": [m["tpot_s"] for m in done if m["tpot_s"] is not None],
              "itl": [x for m in done for x in m["itl_s"]], "e2e": [m["e2e_s"] for m in done]}
    for name, values in series.items():
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(values, q)
        out[f"{name}_mean_s"] = sum(values) / len(values) if values else None
    return out


def summarize(requests: list[Request], wall_s: float, steps: list[StepStats] = (),
              ttft_slo_s: float | None = None, tpot_slo_s: float | None = None) -> dict:
    """Aggregate metrics over finished requests.

    Args:
        requests: the requests of a run (any status).
        wall_s: wall time of the run in seconds (throughput and goodput divide by it).
        steps: step records, for step-level means and ``decode_split`` (``decode_step_split``).
        ttft_slo_s, tpot_slo_s: SLOs for goodput; None means no limit on that metric.
    Returns: dict with throughput_tok_s, percentiles of TTFT / TPOT / ITL / E2E (s), goodput_rps,
        acceptance_rate and mean_accepted_length (None without speculation), and from ``steps``
        prefix_cache_hit_rate (None when no step looked anything up: prefix caching off).
    """
    proposed = sum(r.num_draft_proposed for r in requests)
    accepted = sum(r.num_draft_accepted for r in requests)
    verify_steps = sum(r.num_verify_steps for r in requests)
    out = {
        **latency_stats([request_metrics(r) for r in requests], wall_s, ttft_slo_s, tpot_slo_s),
        "num_requests": len(requests),
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted_length": (sum(r.num_verify_emitted for r in requests) / verify_steps if verify_steps
                                 else None),
        "num_draft_proposed": proposed,
        "num_draft_accepted": accepted,
        "num_preemptions": sum(r.num_preemptions for r in requests),
    }
    if steps:
        out["decode_split"] = decode_step_split(steps)
        out["num_steps"] = len(steps)
        out["mean_step_s"] = sum(s.duration_s for s in steps) / len(steps)
        out["mean_tokens_per_step"] = sum(s.num_tokens for s in steps) / len(steps)
        out["draft_time_s"] = sum(s.draft_time_s for s in steps)
        out["target_time_s"] = sum(s.target_time_s for s in steps)
        queried = sum(s.num_prefix_query_tokens for s in steps)
        out["prefix_cache_hit_rate"] = (sum(s.num_prefix_hit_tokens for s in steps) / queried if queried
                                        else None)
    return out
