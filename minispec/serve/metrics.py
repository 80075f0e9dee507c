"""Prometheus metrics of the server, named after vLLM's so the same dashboards and scripts work.

Every name starts with ``minispec:`` where vLLM's starts with ``vllm:`` (e.g.
``minispec:time_to_first_token_seconds``, ``minispec:spec_decode_num_accepted_tokens_total``).
Each ServerMetrics owns its own registry: no module-level state, so two servers (or two tests)
in one process never share counters. Definitions of TTFT, TPOT and ITL are minispec/core/support/metrics.py's.
Invariant: counters only grow; only the engine thread writes them, any thread may scrape.
Used by minispec/serve/app.py; docs/production.md reads them to get acceptance rates from a server.
"""

from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)

from minispec.core.support.metrics import request_metrics
from minispec.core.request import RequestStatus

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0)
TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                   2.5, 5.0, 10.0)
E2E_BUCKETS_S = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0)


class ServerMetrics:
    """Counters, gauges and histograms of one server, labelled with its model name.

    Args:
        model_name: the served model name (label ``model_name``, as vLLM labels its metrics).
    """

    def __init__(self, model_name: str, engine_info: dict[str, str] | None = None):
        self.registry = CollectorRegistry()
        label = {"model_name": model_name}

        def make(kind, name, doc, *extra_labels, **kw):
            metric = kind(f"minispec:{name}", doc, ["model_name", *extra_labels],
                          registry=self.registry, **kw)
            return metric if extra_labels else metric.labels(**label)

        self._label = label
        self.num_running = make(Gauge, "num_requests_running", "Requests holding KV blocks (running).")
        self.num_waiting = make(Gauge, "num_requests_waiting", "Requests queued, holding no KV blocks.")
        self.kv_usage = make(Gauge, "kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).")
        self.kv_used = make(Gauge, "kv_cache_used_blocks", "KV blocks in use.")
        self.prompt_tokens = make(Counter, "prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = make(Counter, "generation_tokens", "Output tokens generated.")
        self.success = make(Counter, "request_success", "Finished requests by finish reason.",
                            "finished_reason")
        self.preemptions = make(Counter, "num_preemptions",
                                "Requests preempted (KV dropped, recomputed later).")
        self.prefix_queries = make(Counter, "prefix_cache_queries",
                                   "Prefix cache queries, in tokens: the tokens of each admitted request.")
        self.prefix_hits = make(Counter, "prefix_cache_hits",
                                "Prefix cache hits, in tokens: those of the queried tokens found cached.")
        self.draft_tokens = make(Counter, "spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.accepted_tokens = make(Counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.drafts = make(Counter, "spec_decode_num_drafts",
                           "Verify steps (one per speculating request-step).")
        self.ttft = make(Histogram, "time_to_first_token_seconds", "Time to first token (s).",
                         buckets=TTFT_BUCKETS_S)
        self.tpot = make(Histogram, "time_per_output_token_seconds",
                         "Mean time per output token after the first, per request (s).",
                         buckets=TOKEN_BUCKETS_S)
        self.itl = make(Histogram, "inter_token_latency_seconds",
                        "Gaps between steps that gave a request tokens (s).", buckets=TOKEN_BUCKETS_S)
        self.e2e = make(Histogram, "e2e_request_latency_seconds", "Arrival to finish (s).",
                        buckets=E2E_BUCKETS_S)
        info = dict(engine_info or {})
        make(Gauge, "engine_config_info", "Engine choices behind these metrics (value 1).", *info).labels(
            **label, **info).set(1)

    def set_gauges(self, health: dict) -> None:
        """Load and KV-cache gauges from the engine thread's snapshot (see EngineLoop.health)."""
        self.num_running.set(health["num_requests_running"])
        self.num_waiting.set(health["num_requests_waiting"])
        self.kv_used.set(health["num_kv_blocks_used"])
        self.kv_usage.set(health["num_kv_blocks_used"] / max(1, health["num_kv_blocks_total"]))

    def count_drafts(self, num_draft_proposed: int, num_draft_accepted: int, num_verify_steps: int) -> None:
        """Add a request's new drafts proposed and accepted and verify steps (vLLM's counter names)."""
        self.draft_tokens.inc(num_draft_proposed)
        self.accepted_tokens.inc(num_draft_accepted)
        self.drafts.inc(num_verify_steps)

    def count_preemptions(self, num: int) -> None:
        self.preemptions.inc(num)

    def count_prefix_cache(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries.inc(num_query_tokens)
        self.prefix_hits.inc(num_hit_tokens)

    def observe_finished(self, req) -> None:
        """Count a finished request; latencies only for those that ended normally (stop, length)."""
        self.success.labels(finished_reason=req.status.value, **self._label).inc()
        if req.status not in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH):
            return
        m = request_metrics(req)
        if m["ttft_s"] is not None:
            self.ttft.observe(m["ttft_s"])
        if m["tpot_s"] is not None:
            self.tpot.observe(m["tpot_s"])
        for gap in m["itl_s"]:
            self.itl.observe(gap)
        if m["e2e_s"] is not None:
            self.e2e.observe(m["e2e_s"])

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the Prometheus text format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
