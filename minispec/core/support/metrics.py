"""Latency and throughput metrics from request timestamps and step records.

Definitions (seconds on the engine's clock, real or virtual):
- TTFT: first token time - arrival time.
- TPOT: (finish - first token) / (output tokens - 1): mean time per output token after the first.
- ITL: gaps between consecutive steps that emitted tokens for a request (a verify step that emits
  several tokens is one gap, as a streaming client sees it).
- E2E latency: finish - arrival.
- throughput: output tokens / wall time (tokens/s).
- goodput: requests/s that finished and met every SLO the caller set (TTFT and TPOT), as in
  DistServe (Zhong et al. 2024); SmartSpec's token-rate goodput is a different quantity.
- acceptance rate: accepted / proposed draft tokens; mean accepted length: tokens emitted per
  verify step, bonus token included. Both count what requests keep: drafts at and past a stop
  count neither as proposed nor as accepted (``Scheduler.keep``), so each verify step keeps its
  accepted drafts plus one token and the mean accepted length also equals 1 + accepted / verify
  steps, the formula a server's counters give (``minispec.serve.client_bench``).
- prefix cache hit rate: tokens found in the prefix cache / tokens looked up, summed over
  admissions (a request's prompt when it is admitted; its prompt and output again if it is
  re-admitted after a preemption), as vLLM counts prefix cache hits and queries.
Invariant: only timestamps the scheduler recorded are used, so a fake clock gives exact values.
The warning when speculation stops paying reads these counters: ``minispec.extras.acceptance_watch``.
Taught in notebooks/00_quickstart.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from minispec.core.request import Request, RequestStatus


@dataclass
class StepStats:
    """One engine step: when, how long (s), and what it packed. With speculation also what the
    policy saw and chose: ``num_held`` (the load it reads: running and waiting requests),
    ``num_decodes`` (requests decoding), ``spec_k`` (the largest k a decode was given: the policy's
    choice after the scheduler's clamps, 0 for a plain step) and ``num_draft_catch_up_tokens`` (the
    tokens a draft model caught up on before drafting: ``core.drafters.DraftProgress``); with
    structured output ``num_forced_draft_tokens`` (drafts a grammar forced: jump-forward, no draft
    forward; grammar_executor.py)."""

    start_s: float
    duration_s: float
    num_requests: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_draft_proposed: int
    num_draft_accepted: int
    num_preempted: int
    num_running: int
    num_waiting: int
    draft_time_s: float
    target_time_s: float
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0
    num_decodes: int = 0
    spec_k: int = 0
    num_draft_catch_up_tokens: int = 0
    num_forced_draft_tokens: int = 0

    @classmethod
    def of(cls, batch, result, start_s: float, end_s: float) -> "StepStats":
        """The stats of a Batch and its StepResult, run from ``start_s`` to ``end_s``."""
        return cls(start_s=start_s, duration_s=end_s - start_s, num_requests=len(batch.scheduled),
                   num_prefill_tokens=batch.num_prefill_tokens, num_decode_tokens=batch.num_decode_tokens,
                   num_draft_proposed=batch.num_draft_proposed,
                   num_draft_accepted=sum(o.num_draft_accepted for o in result.outputs),
                   num_preempted=len(batch.preempted),
                   num_running=batch.num_running, num_waiting=batch.num_waiting,
                   draft_time_s=result.draft_time_s, target_time_s=result.target_time_s,
                   num_prefix_query_tokens=batch.num_prefix_query_tokens,
                   num_prefix_hit_tokens=batch.num_prefix_hit_tokens,
                   num_decodes=sum(not s.is_prefill for s in batch.scheduled),
                   spec_k=max((s.num_speculative_tokens for s in batch.scheduled), default=0),
                   num_draft_catch_up_tokens=sum(s.num_catch_up_tokens for s in batch.scheduled),
                   num_forced_draft_tokens=sum(s.num_forced_draft_tokens for s in batch.scheduled))

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_proposed

    @property
    def num_held(self) -> int:
        """Requests the engine held this step, running and waiting: the load a policy reads."""
        return self.num_running + self.num_waiting


class StepLog:
    """An engine observer that keeps every step's StepStats: ``log = engine.add_observer(StepLog())``."""

    def __init__(self):
        self.stats: list[StepStats] = []

    def __call__(self, record) -> None:
        self.stats.append(record.stats)

    def clear(self) -> None:
        self.stats.clear()


def count_verify(req: Request, out) -> None:
    """Count one verify step of ``req`` (its kept EmittedTokens ``out``) in the counters the
    acceptance metrics read: verify steps, tokens emitted, drafts proposed and accepted, and per
    draft position (a chain's drafts, a tree's depths) how often it was proposed and accepted."""
    req.num_verify_steps += 1
    req.num_verify_emitted += len(out.token_ids)
    req.num_draft_proposed += out.num_draft_proposed
    req.num_draft_accepted += out.num_draft_accepted
    positions = out.num_speculative_tokens
    grow = positions - len(req.proposed_by_position)
    if grow > 0:
        req.proposed_by_position += [0] * grow
        req.accepted_by_position += [0] * grow
    for i in range(positions):
        req.proposed_by_position[i] += 1
        req.accepted_by_position[i] += i < out.num_draft_accepted


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated q-th percentile (0..100); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_metrics(req: Request) -> dict:
    """Per-request metrics (seconds, token counts, speculation counters)."""
    times = req.token_times_s
    out = {
        "request_id": req.request_id,
        "lane": req.lane,
        "status": req.status.value,
        "num_prompt_tokens": req.num_prompt_tokens,
        "num_output_tokens": req.num_output_tokens,
        "num_preemptions": req.num_preemptions,
        "num_cached_tokens": req.num_cached_tokens,
        "ttft_s": None if req.first_token_time_s is None else req.first_token_time_s - req.arrival_time_s,
        "tpot_s": None,
        "itl_s": [b - a for a, b in zip(times, times[1:])],
        "e2e_s": None if req.finish_time_s is None else req.finish_time_s - req.arrival_time_s,
        "num_draft_proposed": req.num_draft_proposed,
        "num_draft_accepted": req.num_draft_accepted,
        "acceptance_rate": (req.num_draft_accepted / req.num_draft_proposed if req.num_draft_proposed
                            else None),
        "mean_accepted_length": (req.num_verify_emitted / req.num_verify_steps if req.num_verify_steps
                                 else None),
        "acceptance_by_position": [a / p for a, p in zip(req.accepted_by_position, req.proposed_by_position)],
    }
    if req.finish_time_s is not None and req.first_token_time_s is not None and req.num_output_tokens > 1:
        out["tpot_s"] = (req.finish_time_s - req.first_token_time_s) / (req.num_output_tokens - 1)
    return out


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
    step, draft, target = (sum(getattr(s, key) for s in decode) / n
                           for key in ("duration_s", "draft_time_s", "target_time_s"))
    return {"num_steps": n, "step_s": step, "draft_s": draft, "target_s": target,
            "other_s": max(step - draft - target, 0.0),
            "num_decodes": sum(s.num_decodes for s in decode) / n,
            "num_draft_rows": sum(s.num_draft_proposed for s in decode) / n}


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
    ms = [request_metrics(r) for r in requests]
    done = [m for m in ms if m["e2e_s"] is not None]
    ttft = [m["ttft_s"] for m in done if m["ttft_s"] is not None]
    tpot = [m["tpot_s"] for m in done if m["tpot_s"] is not None]
    itl = [x for m in done for x in m["itl_s"]]
    e2e = [m["e2e_s"] for m in done]
    num_out = sum(m["num_output_tokens"] for m in done)
    proposed = sum(r.num_draft_proposed for r in requests)
    accepted = sum(r.num_draft_accepted for r in requests)
    verify_steps = sum(r.num_verify_steps for r in requests)
    wall = max(wall_s, 1e-12)
    out = {
        "num_requests": len(requests),
        "num_finished": len(done),
        "num_output_tokens": num_out,
        "wall_s": wall_s,
        "throughput_tok_s": num_out / wall,
        "request_throughput_rps": len(done) / wall,
        "goodput_rps": sum(meets_slo(m, ttft_slo_s, tpot_slo_s) for m in done) / wall,
        "acceptance_rate": accepted / proposed if proposed else None,
        "mean_accepted_length": (sum(r.num_verify_emitted for r in requests) / verify_steps if verify_steps
                                 else None),
        "num_draft_proposed": proposed,
        "num_draft_accepted": accepted,
        "num_preemptions": sum(r.num_preemptions for r in requests),
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(values, q)
        out[f"{name}_mean_s"] = sum(values) / len(values) if values else None
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
