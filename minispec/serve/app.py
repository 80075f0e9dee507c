"""An OpenAI-compatible HTTP server (Starlette on uvicorn) around one engine thread.

Handlers never touch the Engine: they validate the body (protocol.py), hand the request to the
EngineLoop (engine_loop.py), and turn what comes back into one JSON response or a stream of
server-sent events ending in ``data: [DONE]``. A client that disconnects mid-stream cancels its
handler, whose ``finally`` aborts the request, so its KV blocks come back.
Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, and /metrics in Prometheus
text with vLLM's names (``minispec:`` instead of ``vllm:``, metrics.py).
Invariant: every response, error or not, is OpenAI-shaped; errors are
``{"error": {"message", "type", "param", "code"}}``.
Used by ``python -m minispec serve`` (minispec/cli/serve.py); docs/production.md measures with it at
production concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from minispec.serve import protocol as proto
from minispec.serve.engine_loop import EngineLoop, Rejected
from minispec.serve.metrics import ServerMetrics


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


def create_app(engine, model_name: str,
               aliases: tuple[str, ...] = (), drain_grace_s: float = 10.0) -> Starlette:
    """Build the ASGI app: the routes, plus an EngineLoop started and stopped by the lifespan.

    Args:
        engine: a built Engine with a tokenizer; the app owns it from now on.
        model_name: the name clients send as ``model`` and see in /v1/models.
        aliases: other names accepted as ``model`` (e.g. the checkpoint path).
        drain_grace_s: on shutdown, how long in-flight requests may keep running before abort.
    Returns: a Starlette app; ``app.state.engine_loop`` is its EngineLoop.
    """
    server = _Server(engine, model_name, aliases)
    routes = [Route("/v1/completions", server.completions, methods=["POST"]),
              Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
              Route("/v1/models", server.models, methods=["GET"]),
              Route("/health", server.health, methods=["GET"]),
              Route("/metrics", server.prometheus, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=server.lifespan, exception_handlers={HTTPException: _http_error})
    app.state.engine_loop = server.engine_loop
    app.state.drain_grace_s = drain_grace_s
    return app


async def _http_error(request: HttpRequest, exc: HTTPException) -> Response:
    """Starlette's own errors (404 unknown path, 405 wrong method) in OpenAI's error shape."""
    return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")


class _Server:
    """What the handlers share: the EngineLoop, its metrics, the model card. One method per endpoint."""

    def __init__(self, engine, model_name: str, aliases: tuple[str, ...]):
        config = engine.config
        self.metrics = ServerMetrics(model_name, {
            "kernels": config.kernels,
            "weights": engine.runner.weights,  # the format that runs (config.weights None: the model's)
            "spec_method": config.spec.method,
            "num_speculative_tokens": str(config.spec.num_speculative_tokens),
            "draft_topk": str(config.spec.draft_topk),
            "num_draft_tokens": str(config.spec.draft_shape.num_draft_tokens),
            "prefix_caching": "on" if config.enable_prefix_caching else "off"})
        self.engine_loop = EngineLoop(engine, self.metrics)
        self.model_name = model_name
        self.names = (model_name, *aliases)
        spec = engine.config.spec
        self.card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "minispec",
                     "max_model_len": engine.max_model_len,
                     "minispec": {"spec": spec.method,
                                  "k": spec.num_speculative_tokens if spec.enabled else 0,
                                  "draft_topk": spec.draft_topk if spec.enabled else None,
                                  "num_draft_tokens": (spec.draft_shape.num_draft_tokens if spec.enabled
                                                       else 0),
                                  "policy": spec.policy if spec.enabled else None}}
        self.limits = proto.Limits(max_model_len=engine.max_model_len, spec_enabled=spec.enabled,
                                   default_k=spec.num_speculative_tokens)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.engine_loop.start()
        try:
            yield
        finally:
            self.engine_loop.stop()

    # -- endpoints ---------------------------------------------------------------------------------
    async def completions(self, request: HttpRequest) -> Response:
        return await self.generate(request, chat=False)

    async def chat_completions(self, request: HttpRequest) -> Response:
        return await self.generate(request, chat=True)

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [self.card]})

    async def health(self, request: HttpRequest) -> Response:
        engine_loop = self.engine_loop
        status = "draining" if engine_loop.drain_deadline_s is not None else "ok"
        alive = engine_loop.thread.is_alive()
        return JSONResponse({"status": status if alive else "dead", **engine_loop.health},
                            status_code=200 if alive and status == "ok" else 503)

    async def prometheus(self, request: HttpRequest) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, media_type=content_type)

    # -- one completion: validate, submit, then stream or collect --------------------------------
    async def generate(self, request: HttpRequest, chat: bool) -> Response:
        """Validate the body, hand it to the engine thread, answer with SSE or one JSON body."""
        try:
            body = json.loads(await request.body() or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the request body is not valid JSON: {exc}")
        try:
            call = proto.parse_request(body, chat, self.names, self.limits)
        except proto.RequestError as exc:
            return _error(exc.status, str(exc), exc.param, exc.code)
        if not self.engine_loop.thread.is_alive():
            return _error(503, "the engine thread is not running; see the server log")
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        handle = _Handle(asyncio.get_running_loop())
        self.engine_loop.submit(rid, call.prompt, call.params, call.lane, handle.put, call.max_tokens_given)
        first = await handle.events.get()
        if isinstance(first, Rejected):
            return _error(first.status, first.message, first.param)
        shape = proto.ResponseShape(rid, self.model_name, chat)
        if call.stream:
            return StreamingResponse(self._stream(handle, shape, call.include_usage, rid),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._collect(request, handle, shape, rid)

    async def _stream(self, handle: _Handle, shape, include_usage: bool, rid: str):
        """Server-sent events, one per Delta with text, ending in ``data: [DONE]``."""
        finished = False
        try:
            if shape.chat:
                yield _sse(shape.role_chunk())
            while True:
                event = await handle.events.get()
                if event.finish_reason == "error":
                    yield _sse(proto.error_body(500, f"the request failed: {event.error}",
                                                code="engine_error"))
                    finished = True
                    break
                if event.new_text or event.finish_reason:
                    yield _sse(shape.chunk(event.new_text, event.finish_reason, event.stop_reason))
                if event.finish_reason:
                    finished = True
                    if include_usage:
                        yield _sse(shape.usage_chunk(event.num_prompt_tokens, event.num_output_tokens))
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away (the ASGI server cancelled us): free its KV
                self.engine_loop.abort(rid)

    async def _collect(self, request: HttpRequest, handle: _Handle, shape, rid: str) -> Response:
        """Wait for the last Delta and answer with one JSON body; abort if the client disconnects first."""
        gone = asyncio.ensure_future(_until_disconnect(request))
        try:
            while True:
                get = asyncio.ensure_future(handle.events.get())
                await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    self.engine_loop.abort(rid)
                    return Response(status_code=499)  # nobody reads it; nginx's "client closed"
                event = get.result()
                if event.finish_reason == "error":
                    return _error(500, f"the request failed: {event.error}", code="engine_error")
                if event.finish_reason:
                    return JSONResponse(shape.full(event.text, event.finish_reason, event.num_prompt_tokens,
                                                   event.num_output_tokens, event.stop_reason))
        except asyncio.CancelledError:
            self.engine_loop.abort(rid)
            raise
        finally:
            gone.cancel()
