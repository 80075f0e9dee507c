"""The engine thread: one background thread owns the Engine; HTTP handlers talk to it by queue.

The engine is single-threaded, so nothing else may touch it. Each request's life here:
1. A handler calls ``submit``: an ``add`` command goes on the queue, with a sink that reaches the
   handler's asyncio queue (the server wraps ``loop.call_soon_threadsafe``).
2. The thread tokenizes and calls ``add_request``; the sink gets Accepted, or Rejected with the
   ValueError's message (the server answers HTTP 400).
3. The thread steps the engine and turns each request's new tokens into a Delta: the cumulative
   output decoded, minus the text already sent. Token counters grow by the tokens a request kept
   (``new_token_ids``: nothing past a stop), so they agree with the usage each response reports.
   A trailing U+FFFD (half a UTF-8 character) and the last ``len(longest stop string) - 1``
   characters are held back until they are settled.
4. The last Delta carries the finish reason and the full text; the request is then forgotten.
5. ``abort`` (a client that went away) ends a request at once, so its KV blocks come back.
When nothing is in flight the thread blocks on its queue instead of spinning.
Invariants: only this thread calls add_request / step / abort; every accepted request gets
exactly one final Delta; a finished request leaves nothing behind in ``engine.requests``.
Used by minispec/serve/app.py; see docs/production.md.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from minispec.serve.metrics import ServerMetrics

log = logging.getLogger("minispec.serve")


@dataclass
class Accepted:
    """The engine took the request; ``num_prompt_tokens`` after tokenization."""

    num_prompt_tokens: int


@dataclass
class Rejected:
    """The engine refused the request (400 for bad input, 503 while shutting down)."""

    message: str
    status: int = 400
    param: str | None = None


@dataclass
class Delta:
    """New text for one request; ``finish_reason`` is set on its last Delta only.

    finish_reason: "stop", "length", "abort" or "error" (then ``error`` says why).
    text: the full output text, on the last Delta only (stop strings cut off).
    stop_reason: the stop string or stop token id that ended the request (last Delta; else None).
    """

    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None
    error: str | None = None
    text: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Stream:
    """Engine-thread state of one accepted request: where its events go, what was sent."""

    sink: Callable[[object], None]
    hold_back: int            # characters kept back while a stop string could still be forming
    sent: str = ""
    num_draft_seen: tuple[int, int, int] = (0, 0, 0)  # proposed, accepted, verify steps counted
    prefilled: bool = False


class EngineLoop:
    """Owns an Engine and steps it on one background thread, fed by a command queue.

    Args:
        engine: a built :class:`~minispec.core.engine.Engine` with a tokenizer.
        metrics: counters and histograms to update, or None.
    Thread safety: ``submit``, ``abort``, ``begin_drain`` and ``stop`` may be called from any
    thread; everything else runs on the engine thread.
    """

    def __init__(self, engine, metrics: ServerMetrics | None = None):
        if engine.tokenizer is None:
            raise ValueError("the server needs an engine with a tokenizer (text in, text out)")
        self.engine = engine
        self.metrics = metrics
        self.commands: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="minispec-engine", daemon=True)
        self.health = self._snapshot()
        self.drain_deadline_s: float | None = None  # set by begin_drain (also from a signal handler)
        self._streams: dict[str, _Stream] = {}
        if metrics is not None:
            engine.add_observer(self._count_step)  # per step, keeping no history

    def _count_step(self, record) -> None:
        """Preemptions and prefix cache lookups of one step."""
        stats = record.stats
        if stats.num_preempted:
            self.metrics.count_preemptions(stats.num_preempted)
        if stats.num_prefix_query_tokens:
            self.metrics.count_prefix_cache(stats.num_prefix_query_tokens, stats.num_prefix_hit_tokens)

    # -- called from any thread ----------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, request_id: str, prompt, params, lane: str, sink: Callable[[object], None],
               max_tokens_given: bool = True) -> None:
        """Queue a request. ``sink`` receives Accepted or Rejected, then Deltas (engine thread)."""
        self.commands.put(("add", request_id, prompt, params, lane, sink, max_tokens_given))

    def abort(self, request_id: str) -> None:
        """Abort a request whose client went away (no event follows)."""
        self.commands.put(("abort", request_id))

    def begin_drain(self, grace_s: float) -> None:
        """Refuse new requests; abort what is still running ``grace_s`` seconds from now.

        Only assigns one attribute, so a signal handler may call it.
        """
        self.drain_deadline_s = time.monotonic() + grace_s

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is left, end the thread, and wait for it."""
        if self.thread.is_alive():
            self.commands.put(("stop",))
            self.thread.join(timeout_s)

    # -- the engine thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            idle = not self.engine.has_unfinished()
            commands = [self.commands.get()] if idle else []
            while True:
                try:
                    commands.append(self.commands.get_nowait())
                except queue.Empty:
                    break
            try:
                if any(self._handle(c) for c in commands):
                    self._abort_all("the server is shutting down")
                    return
                if self.drain_deadline_s is not None and time.monotonic() >= self.drain_deadline_s:
                    self._abort_all("the server is shutting down")
                if self.engine.has_unfinished():
                    outputs = self.engine.step()
                    # gauges first: a client that reads /health once its answer arrives sees the
                    # blocks this step freed, not the step before's
                    self._update_gauges()
                    self._publish(outputs)
            except Exception:  # a bug here must not take the server down: fail what is in flight
                log.exception("engine loop iteration failed")
                self._abort_all("internal error in the engine loop", error=True)
            self._update_gauges()

    def _handle(self, command) -> bool:
        """Apply one command. Returns True for ``stop``."""
        kind = command[0]
        if kind == "stop":
            return True
        if kind == "abort":
            self._abort(command[1])
        elif kind == "add":
            self._add(*command[1:])
        return False

    def _add(self, request_id, prompt, params, lane, sink, max_tokens_given) -> None:
        if self.drain_deadline_s is not None:
            sink(Rejected("the server is shutting down and takes no new requests", status=503))
            return
        engine = self.engine
        try:
            try:
                ids = engine.tokenize(prompt)
            except ValueError:
                raise
            except Exception as exc:  # e.g. a chat template that refuses these messages
                raise ValueError(f"could not tokenize the prompt: {exc}") from exc
            room = engine.max_model_len - len(ids)  # room <= 0: add_request explains the prompt is too long
            if max_tokens_given and 0 < room < params.max_tokens:
                raise ValueError(
                    f"this model's maximum context length is {engine.max_model_len} tokens, but "
                    f"{len(ids)} prompt tokens + max_tokens={params.max_tokens} exceed it: "
                    f"ask for at most {room} tokens")
            if not max_tokens_given:
                params = replace(params, max_tokens=max(1, room))
            engine.add_request(ids, params, request_id=request_id, lane=lane)
        except ValueError as exc:
            sink(Rejected(str(exc)))
            return
        except Exception as exc:  # a bug, not the client's fault; keep serving the others
            log.exception("add_request failed")
            sink(Rejected(f"internal error: {type(exc).__name__}: {exc}", status=500))
            return
        hold = max((len(s) for s in params.stop), default=1) - 1
        self._streams[request_id] = _Stream(sink, hold)
        sink(Accepted(len(ids)))

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        req = self.engine.requests.get(request_id)
        if stream is None or req is None:
            return  # already finished: nothing to free
        if not req.finished:
            self.engine.abort(request_id)
            self._observe_finished(req)
        self.engine.release(request_id)

    def _abort_all(self, reason: str, error: bool = False) -> None:
        """End every request in flight and tell its handler (finish_reason "abort" or "error")."""
        for rid in list(self._streams):
            req = self.engine.requests.get(rid)
            if req is not None and not req.finished:
                try:
                    self.engine.abort(rid)
                except ValueError:  # after a failed step the scheduler may no longer hold it
                    log.warning("could not abort %s cleanly", rid)
            stream = self._streams.pop(rid)
            if req is not None:
                self._observe_finished(req)
                if req.finished:
                    self.engine.release(rid)
                finish = "error" if error else "abort"
                stream.sink(Delta("", req.num_prompt_tokens, req.num_output_tokens, finish,
                                  error=reason if error else None, text=stream.sent))

    def _publish(self, outputs) -> None:
        """Send each changed request its new text; forget finished requests."""
        engine = self.engine
        for out in outputs:
            stream = self._streams.get(out.request_id)
            req = engine.requests.get(out.request_id)
            if stream is None or req is None:
                continue
            self._count_tokens(req, stream, len(out.new_token_ids))
            text = self._visible_text(req, stream, out.finished)
            new = ""
            if text.startswith(stream.sent):
                new, stream.sent = text[len(stream.sent):], text
            if not out.finished:
                if new:
                    stream.sink(Delta(new, req.num_prompt_tokens, req.num_output_tokens))
                continue
            self._observe_finished(req)
            del self._streams[out.request_id]
            engine.release(out.request_id)
            full = stream.sent if out.error else engine.text(req)
            stream.sink(Delta(new, req.num_prompt_tokens, req.num_output_tokens, out.finish_reason, out.error,
                              full, out.stop_reason))

    def _visible_text(self, req, stream: _Stream, finished: bool) -> str:
        if finished:
            return self.engine.text(req)
        text = self.engine.tokenizer.decode(req.output_token_ids, skip_special_tokens=True)
        text = text.rstrip("\ufffd")  # half of a multi-byte character: wait for the rest
        return text[: len(text) - stream.hold_back] if stream.hold_back else text

    # -- metrics --------------------------------------------------------------------------------
    def _count_tokens(self, req, stream: _Stream, num_new: int) -> None:
        if self.metrics is None:
            return
        if not stream.prefilled and req.num_output_tokens:
            stream.prefilled = True
            self.metrics.prompt_tokens.inc(req.num_prompt_tokens)
        self.metrics.generation_tokens.inc(num_new)
        seen = (req.num_draft_proposed, req.num_draft_accepted, req.num_verify_steps)
        self.metrics.count_drafts(*(now - before for now, before in zip(seen, stream.num_draft_seen)))
        stream.num_draft_seen = seen

    def _observe_finished(self, req) -> None:
        if self.metrics is not None:
            self.metrics.observe_finished(req)

    def _snapshot(self) -> dict:
        bm = self.engine.block_manager
        sched = self.engine.scheduler
        return {"num_requests_running": len(sched.running), "num_requests_waiting": sched.num_waiting,
                "num_kv_blocks_used": bm.num_used_blocks, "num_kv_blocks_total": bm.num_blocks}

    def _update_gauges(self) -> None:
        self.health = self._snapshot()  # one assignment: readers on other threads see a whole dict
        if self.metrics is not None:
            self.metrics.set_gauges(self.health)
