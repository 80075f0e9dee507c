"""An OpenAI-compatible HTTP server around one Engine, stepped by one background thread.

The engine is single-threaded, so HTTP handlers never touch it. Each request's life:
1. A handler parses and validates the JSON body (minispec/openai_protocol.py) and puts an
   ``add`` command on the engine thread's queue, with a sink that reaches its asyncio queue.
2. The engine thread tokenizes and calls ``add_request``; a ValueError comes back as HTTP 400.
3. The thread steps the engine, turns each request's new tokens into a text delta (the
   cumulative output decoded, minus what was sent; a trailing U+FFFD and a possible stop-string
   prefix are held back), and hands it over with ``loop.call_soon_threadsafe``.
4. The handler streams the deltas as server-sent events, or gathers them into one response.
5. A client that goes away sends ``abort``: the request ends and its KV blocks come back.
When nothing is in flight the thread blocks on its queue instead of spinning.
Invariants: only the engine thread calls add_request / step / abort; every accepted request
gets exactly one final event; a finished request leaves nothing behind in the engine.
/metrics speaks Prometheus text with names after vLLM's (``minispec:`` instead of ``vllm:``).
Used by ``python -m minispec serve`` and docs/production.md (measuring at production concurrency).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from minispec import openai_protocol as proto
from minispec.server_metrics import ServerMetrics

log = logging.getLogger("minispec.server")


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
    """

    new_text: str
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: str | None = None
    error: str | None = None
    text: str | None = None


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
        engine: a built :class:`~minispec.engine.Engine` with a tokenizer.
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
                    self._publish(self.engine.step())
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
            room = engine.max_model_len - len(ids)
            if max_tokens_given and ids and params.max_tokens > room:
                raise ValueError(
                    f"this model's maximum context length is {engine.max_model_len} tokens, but "
                    f"{len(ids)} prompt tokens + max_tokens={params.max_tokens} exceed it: "
                    f"ask for at most {max(room, 0)} tokens")
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
        del self.engine.requests[request_id]

    def _abort_all(self, reason: str, error: bool = False) -> None:
        """End every request in flight and tell its handler (finish_reason "abort" or "error")."""
        for rid in list(self._streams):
            req = self.engine.requests.get(rid)
            if req is not None and not req.finished:
                self.engine.abort(rid)
            stream = self._streams.pop(rid)
            if req is not None:
                self._observe_finished(req)
                self.engine.requests.pop(rid, None)
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
            del engine.requests[out.request_id]
            stream.sink(Delta(new, req.num_prompt_tokens, req.num_output_tokens, out.finish_reason,
                              error=out.error, text=engine.text(req) if out.finish_reason != "error" else stream.sent))
        if engine.steps:
            if self.metrics is not None:
                self.metrics.count_preemptions(sum(s.num_preempted for s in engine.steps))
            engine.steps.clear()  # a server runs for days: keep no per-step history

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


# -- the HTTP side ------------------------------------------------------------------------------
def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(proto.error_body(status, message, param, code), status_code=status)


class _Handle:
    """One request's asyncio queue, filled from the engine thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue = asyncio.Queue()

    def put(self, event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def _until_disconnect(request: HttpRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_app(engine, model_name: str, aliases: tuple[str, ...] = (), drain_grace_s: float = 10.0) -> Starlette:
    """Build the ASGI app: the routes, plus an EngineLoop started and stopped by the lifespan.

    Args:
        engine: a built Engine with a tokenizer; the app owns it from now on.
        model_name: the name clients send as ``model`` and see in /v1/models.
        aliases: other names accepted as ``model`` (e.g. the checkpoint path).
        drain_grace_s: on shutdown, how long in-flight requests may keep running before abort.
    Returns: a Starlette app; ``app.state.engine_loop`` is its EngineLoop.
    """
    metrics = ServerMetrics(model_name)
    engine_loop = EngineLoop(engine, metrics)
    names = (model_name, *aliases)
    spec = engine.config.spec
    card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "minispec",
            "max_model_len": engine.max_model_len,
            "minispec": {"spec": spec.method, "k": spec.num_speculative_tokens if spec.enabled else 0,
                         "policy": spec.policy if spec.enabled else None}}
    limits = proto.Limits(max_model_len=engine.max_model_len, spec_enabled=spec.enabled,
                          default_k=spec.num_speculative_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()

    async def generate(request: HttpRequest, chat: bool) -> Response:
        try:
            body = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}")
        try:
            call = proto.parse_request(body, chat, names, limits)
        except proto.RequestError as exc:
            return _error(400, str(exc), exc.param, exc.code)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        handle = _Handle(asyncio.get_running_loop())
        engine_loop.submit(rid, call.prompt, call.params, call.lane, handle.put, call.max_tokens_given)
        first = await handle.events.get()
        if isinstance(first, Rejected):
            return _error(first.status, first.message, first.param)
        shape = proto.ResponseShape(rid, model_name, chat)
        if call.stream:
            return StreamingResponse(_stream(handle, shape, call.include_usage, rid),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await _collect(request, handle, shape, rid)

    async def _stream(handle: _Handle, shape, include_usage: bool, rid: str):
        finished = False
        try:
            if shape.chat:
                yield _sse(shape.role_chunk())
            while True:
                event = await handle.events.get()
                if event.finish_reason == "error":
                    yield _sse(proto.error_body(500, f"the request failed: {event.error}", code="engine_error"))
                    finished = True
                    break
                if event.new_text or event.finish_reason:
                    yield _sse(shape.chunk(event.new_text, event.finish_reason))
                if event.finish_reason:
                    finished = True
                    if include_usage:
                        yield _sse(shape.usage_chunk(event.num_prompt_tokens, event.num_output_tokens))
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (the ASGI server cancelled us): free its KV
                engine_loop.abort(rid)

    async def _collect(request: HttpRequest, handle: _Handle, shape, rid: str) -> Response:
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            while True:
                get = asyncio.ensure_future(handle.events.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    engine_loop.abort(rid)
                    return Response(status_code=499)  # nobody reads it; nginx's "client closed"
                event = get.result()
                if event.finish_reason == "error":
                    return _error(500, f"the request failed: {event.error}", code="engine_error")
                if event.finish_reason:
                    return JSONResponse(shape.full(event.text, event.finish_reason, event.num_prompt_tokens,
                                                   event.num_output_tokens))
        except asyncio.CancelledError:
            engine_loop.abort(rid)
            raise
        finally:
            gone.cancel()

    async def completions(request: HttpRequest) -> Response:
        return await generate(request, chat=False)

    async def chat_completions(request: HttpRequest) -> Response:
        return await generate(request, chat=True)

    async def models(request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [card]})

    async def health(request: HttpRequest) -> Response:
        status = "draining" if engine_loop.drain_deadline_s is not None else "ok"
        alive = engine_loop.thread.is_alive()
        return JSONResponse({"status": status if alive else "dead", **engine_loop.health},
                            status_code=200 if alive and status == "ok" else 503)

    async def prometheus(request: HttpRequest) -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    async def http_error(request: HttpRequest, exc: HTTPException) -> Response:
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat_completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", prometheus, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.engine_loop = engine_loop
    app.state.drain_grace_s = drain_grace_s
    return app
