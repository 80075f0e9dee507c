"""The counters a step fills and the per-request metrics read from them.

Definitions (seconds on the engine's clock, real or virtual):
- TTFT: first token time - arrival time.
- TPOT: (finish - first token) / (output tokens - 1): mean time per output token after the first.
- ITL: gaps between consecutive steps that emitted tokens for a request (a verify step that emits
  several tokens is one gap, as a streaming client sees it).
- E2E latency: finish - arrival.
- acceptance rate: accepted / proposed draft tokens; mean accepted length: tokens emitted per
  verify step, bonus token included. Both count what requests keep: drafts at and past a stop
  count neither as proposed nor as accepted (``Scheduler.keep``), so each verify step keeps its
  accepted drafts plus one token and the mean accepted length also equals 1 + accepted / verify
  steps, the formula a server's counters give (``minispec.serve.client_bench``).
Invariant: only timestamps the scheduler recorded are used, so a fake clock gives exact values.
A run's aggregates (throughput, goodput, percentiles, the prefix cache's hit rate) are
``minispec.tools.summary``; the warning when speculation stops paying reads these counters:
``minispec.speculation.acceptance_watch``. Taught in notebooks/00_quickstart.ipynb and
notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from minispec.core.request import Request


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
