"""Benchmark any OpenAI-compatible server (minispec serve, vLLM, SGLang) with the in-process workloads.

The same closed-loop and Poisson workloads as minispec/tools/workload.py, driven over HTTP with
streaming responses, give rows with the same keys as ``bench.ROW_KEYS``. What a client sees:
- TTFT: arrival (send time, or the scheduled Poisson arrival) to the first chunk with text;
- ITL: gaps between chunks with text (a verify step that emits several tokens is one chunk);
- TPOT: (finish - first text chunk) / (output tokens - 1), output tokens from the server's
  ``usage`` (``stream_options.include_usage``), never from counting chunks;
- acceptance rate and mean accepted length: from the server's Prometheus counters
  (``minispec:`` or ``vllm:spec_decode_num_*``), read before and after each load level.
Compared with the in-process bench these include HTTP, JSON and detokenization, which is the
point: it is what users of a real server get. ``python -m minispec bench --url`` (minispec/cli/bench.py)
runs it. Taught in docs/production.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm.auto import tqdm

from minispec.tools.bench import ROW_KEYS, add_speedups
from minispec.tools.summary import latency_stats
from minispec.tools.workload import poisson_arrivals

COUNTER_PREFIXES = ("minispec:", "vllm:")


@dataclass
class Record:
    """One request as the client saw it. Times in seconds on ``time.perf_counter``."""

    arrival_s: float
    token_times_s: list[float] = field(default_factory=list)  # one per chunk that carried text
    finish_s: float | None = None
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None  # from usage; None if the server sent none
    error: str | None = None

    def metrics(self) -> dict:
        """TTFT / TPOT / ITL / E2E in the shape of ``metrics.request_metrics`` (s)."""
        times = self.token_times_s
        end = self.finish_s if self.finish_s is not None else (times[-1] if times else None)
        num_out = self.num_output_tokens if self.num_output_tokens is not None else len(times)
        ok = self.error is None and self.finish_reason in ("stop", "length")
        return {"status": self.finish_reason if ok else (self.finish_reason or "error"),
                "num_output_tokens": num_out, "num_prompt_tokens": self.num_prompt_tokens,
                "ttft_s": times[0] - self.arrival_s if times else None,
                "tpot_s": ((end - times[0]) / (num_out - 1) if times and end is not None and num_out > 1
                           else None),
                "itl_s": [b - a for a, b in zip(times, times[1:])],
                "e2e_s": end - self.arrival_s if ok and end is not None else None}


def summarize_records(records: list[Record], wall_s: float, ttft_slo_s: float | None = None,
                      tpot_slo_s: float | None = None) -> dict:
    """Aggregate client-side records like ``summary.summarize`` (same keys where measurable)."""
    ms = [r.metrics() for r in records]
    done = [m for m in ms if m["e2e_s"] is not None]
    return {**latency_stats(ms, wall_s, ttft_slo_s, tpot_slo_s), "num_requests": len(records),
            "num_errors": len(records) - len(done),
            "num_prompt_tokens": sum(m["num_prompt_tokens"] or 0 for m in done),
            "tokens_from_usage": all(r.num_output_tokens is not None for r in records if r.error is None)}


class Client:
    """Streams requests to one server. ``base_url`` without /v1; ``model`` as the server names it."""

    def __init__(self, base_url: str, model: str, body: dict,
                 api_key: str | None = None, max_connections=None):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.body = body
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                      timeout=httpx.Timeout(None, connect=30.0),
                                      limits=httpx.Limits(max_connections=max_connections,
                                                          max_keepalive_connections=max_connections))

    async def send(self, prompt, arrival_s: float, **overrides) -> Record:
        """One streamed request; errors end up in ``Record.error``, never raised."""
        chat = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)
        body = {**self.body, **overrides, "model": self.model, "stream": True,
                "stream_options": {"include_usage": True}, ("messages" if chat else "prompt"): prompt}
        rec = Record(arrival_s)
        try:
            async with self.http.stream("POST", "/v1/chat/completions" if chat else "/v1/completions",
                                        json=body) as resp:
                if resp.status_code != 200:
                    rec.error = (f"HTTP {resp.status_code}: "
                                 f"{(await resp.aread()).decode(errors='replace')[:500]}")
                    return rec
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    self._apply(rec, json.loads(data), chat, time.perf_counter())
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        if rec.error is None and rec.finish_reason is None:
            rec.error = "the stream ended without a finish_reason"
        return rec

    @staticmethod
    def _apply(rec: Record, chunk: dict, chat: bool, now: float) -> None:
        if "error" in chunk:
            rec.error = str(chunk["error"].get("message", chunk["error"]))
            return
        usage = chunk.get("usage")
        if usage:
            rec.num_prompt_tokens = usage.get("prompt_tokens")
            rec.num_output_tokens = usage.get("completion_tokens")
        for choice in chunk.get("choices") or ():
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if text:
                rec.token_times_s.append(now)
            if choice.get("finish_reason"):
                rec.finish_reason = choice["finish_reason"]
                rec.finish_s = now

    async def get_json(self, path: str) -> dict:
        resp = await self.http.get(path)
        resp.raise_for_status()
        return resp.json()

    async def counters(self) -> dict[str, float] | None:
        """Sums of the server's Prometheus samples by name (labels summed), or None without /metrics."""
        try:
            resp = await self.http.get("/metrics")
            if resp.status_code != 200:
                return None
            totals: dict[str, float] = {}
            for family in text_string_to_metric_families(resp.text):
                for s in family.samples:
                    if s.name.startswith(COUNTER_PREFIXES) and not s.name.endswith("_created"):
                        totals[s.name] = totals.get(s.name, 0.0) + s.value
            return totals
        except (httpx.HTTPError, ValueError):
            return None


async def closed_loop(client: Client, prompts: list, concurrency: int, num_requests: int, progress=None):
    """``concurrency`` clients, each sending its next request when its previous one ends.
    Returns (records in send order, wall time in seconds)."""
    order = itertools.count()
    records: list[Record | None] = [None] * num_requests

    async def user():
        while (i := next(order)) < num_requests:
            records[i] = await client.send(prompts[i % len(prompts)], time.perf_counter())
            if progress is not None:
                progress.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(min(concurrency, num_requests))))
    return records, time.perf_counter() - start


async def poisson(client: Client, prompts: list, qps: float, num_requests: int, seed: int = 0, progress=None):
    """Open-loop arrivals at ``qps`` requests/s; TTFT counts from the scheduled arrival."""
    start = time.perf_counter()
    arrivals = [start + a for a in poisson_arrivals(qps, num_requests, seed)]

    async def one(i):
        await asyncio.sleep(max(0.0, arrivals[i] - time.perf_counter()))
        rec = await client.send(prompts[i % len(prompts)], arrivals[i])
        if progress is not None:
            progress.update(1)
        return rec

    records = await asyncio.gather(*(one(i) for i in range(num_requests)))
    return list(records), time.perf_counter() - start


def _spec_stats(before: dict | None, after: dict | None) -> dict:
    """Acceptance rate, mean accepted length (bonus included) and preemptions from counter deltas.
    The mean accepted length is 1 + accepted / drafts: tokens per verify step, the number
    ``minispec.core.support.metrics`` gives, because every verify step the engine counts keeps its accepted
    drafts plus one token (``Scheduler.keep`` counts a stop inside the accepted drafts so)."""
    out = {"acceptance_rate": None, "mean_accepted_length": None, "num_preemptions": None}
    if not before or not after:
        return out
    for prefix in COUNTER_PREFIXES:
        def delta(name):
            key = f"{prefix}{name}_total"
            return after[key] - before.get(key, 0.0) if key in after else None

        proposed, accepted = delta("spec_decode_num_draft_tokens"), delta("spec_decode_num_accepted_tokens")
        drafts, preempted = delta("spec_decode_num_drafts"), delta("num_preemptions")
        if preempted is not None:
            out["num_preemptions"] = int(preempted)
        if proposed:
            out["acceptance_rate"] = accepted / proposed
        if drafts:
            out["mean_accepted_length"] = 1 + accepted / drafts
    return out


async def _discover(client: Client, model: str | None) -> tuple[str, dict]:
    """The model name to send and the server's model card (minispec adds its spec settings)."""
    try:
        cards = (await client.get_json("/v1/models")).get("data", [])
    except (httpx.HTTPError, ValueError) as exc:
        raise ValueError(f"could not list models at {client.base_url}/v1/models: {exc}") from None
    ids = [c.get("id") for c in cards]
    if model in ids:
        return model, cards[ids.index(model)]
    if model is None and len(ids) == 1:
        return ids[0], cards[0]
    served = ", ".join(map(str, ids)) or "nothing"
    what = "several models" if model is None else f"no model {model!r}"
    raise ValueError(f"{client.base_url} serves {what}: it serves {served} (pass one of them with --model)")


def url_bench_rows(url: str, prompts: list, concurrencies: list[int], num_requests: int, max_tokens: int,
                   temperature: float = 0.0, ignore_eos: bool = False, seed: int = 0,
                   qps: list[float] | None = None, model: str | None = None, ttft_slo_s: float | None = None,
                   tpot_slo_s: float | None = None, label: dict | None = None,
                   request_extra: dict | None = None, warmup: bool = True, progress: bool = True,
                   api_key: str | None = None, extra: dict | None = None) -> list[dict]:
    """Run each load level (concurrency, or Poisson QPS) against a server; one row per level.

    Args:
        url: base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is dropped).
        prompts: text prompts and/or chat message lists (chat ones go to /v1/chat/completions).
        model: the served model name; None picks the only one the server lists.
        label: {"spec", "k", "policy"} for the rows; a minispec server's own card overrides it.
        request_extra: more body fields for every request (e.g. {"lane": "bulk"}).
    Returns: rows with ``bench.ROW_KEYS`` (plus ``extra``); speedup_vs_off is filled in by
        ``add_speedups`` from spec-off rows among them. Raises: ValueError if the server cannot be
        reached, does not serve ``model``, or every request of a level fails.
    """
    base = url.rstrip("/").removesuffix("/v1")
    body = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, **(request_extra or {})}
    if ignore_eos:
        body["ignore_eos"] = True
    loads = [("qps", q) for q in qps] if qps else [("concurrency", c) for c in concurrencies]

    async def run() -> list[dict]:
        client = Client(base, model or "", body, api_key)
        try:
            client.model, card = await _discover(client, model)
            tag = _server_tag(card, label or {})
            rows = []
            with tqdm(total=len(loads) * num_requests, desc="bench --url", disable=not progress) as bar:
                for kind, load in loads:
                    if warmup:
                        await client.send(prompts[0], time.perf_counter(), max_tokens=min(4, max_tokens))
                    summary, spec_stats = await _measure_level(client, prompts, kind, load, num_requests,
                                                               seed, bar, ttft_slo_s, tpot_slo_s)
                    rows.append(_row(tag, kind, load, summary, spec_stats, base, client.model, extra or {}))
            return rows
        finally:
            await client.http.aclose()

    rows = asyncio.run(run())
    add_speedups(rows)
    return rows


def _server_tag(card: dict, label: dict) -> dict:
    """spec / k / policy for the rows: a minispec server's model card says; otherwise the caller's label."""
    own = card.get("minispec") or {}
    return {"spec": own.get("spec", label.get("spec", "unknown")), "k": own.get("k", label.get("k")),
            "draft_topk": own.get("draft_topk", label.get("draft_topk")),
            "num_draft_tokens": own.get("num_draft_tokens", label.get("num_draft_tokens")),
            "policy": own.get("policy", label.get("policy"))}


async def _measure_level(client: Client, prompts: list, kind: str, load, num_requests: int, seed: int, bar,
                         ttft_slo_s: float | None, tpot_slo_s: float | None) -> tuple[dict, dict]:
    """One load level: (client-side summary, speculation stats from the server's counters over the level).

    Raises: ValueError if every request of the level failed (the first error says why).
    """
    before = await client.counters()
    if kind == "qps":
        records, wall = await poisson(client, prompts, load, num_requests, seed, bar)
    else:
        records, wall = await closed_loop(client, prompts, load, num_requests, bar)
    summary = summarize_records(records, wall, ttft_slo_s, tpot_slo_s)
    if summary["num_finished"] == 0:
        first = next(r.error for r in records if r.error)
        raise ValueError(f"every request at {kind}={load} failed; the first: {first}")
    return summary, _spec_stats(before, await client.counters())


def _row(tag: dict, kind: str, load, summary: dict, spec_stats: dict,
         url: str, model: str, extra: dict) -> dict:
    """One bench row (``bench.ROW_KEYS`` plus what only a client sees); engine-internal timings are None."""
    return {**tag, "concurrency": load if kind == "concurrency" else None,
            "qps": load if kind == "qps" else None,
            **{key: summary.get(key) for key in ROW_KEYS if key in summary}, **spec_stats,
            "mean_step_s": None, "draft_time_s": None, "target_time_s": None,
            **{k: summary[k] for k in ("num_finished", "num_errors", "num_output_tokens",
                                       "num_prompt_tokens", "tokens_from_usage", "e2e_p50_s")},
            "url": url, "model": model, **extra}


def merge_baseline(rows: list[dict], baseline_path: str) -> None:
    """Set speedup_vs_off against the spec-off rows of an earlier bench's JSON, load by load
    (None where the baseline has no row at the same concurrency or QPS)."""
    with open(baseline_path) as f:
        ref = {(r["concurrency"], r["qps"]): r["throughput_tok_s"] for r in json.load(f)
               if r.get("spec") == "off"}
    if not ref:
        raise ValueError(f"{baseline_path} holds no spec-off rows to compare against")
    for r in rows:
        base = ref.get((r["concurrency"], r["qps"]))
        r["speedup_vs_off"] = r["throughput_tok_s"] / base if base else None
