"""The OpenAI wire format: request bodies in, JSON and server-sent-event chunks out.

Pure functions and small classes, no I/O, so every rule here is testable without a server.
Invariant: a body that passes ``parse_request`` maps onto a valid SamplingParams; anything else
raises RequestError, which the server answers with HTTP 400 in OpenAI's error shape
``{"error": {"message", "type", "param", "code"}}`` (404 ``model_not_found`` for an unknown
model, as OpenAI and vLLM answer). Integer fields refuse booleans (``"max_tokens": true`` is not
1). Extras beyond OpenAI's fields, as vLLM accepts them: ``ignore_eos``, ``top_k``,
``stop_token_ids``, ``min_tokens``, ``lane`` ("interactive" | "bulk") or ``priority`` (int,
0 = interactive, above 0 = bulk), ``speculate`` (bool) and ``num_speculative_tokens`` (0 opts
out, k > 0 asks for k draft tokens). ``response_format`` as OpenAI documents it: ``{"type":
"text"}``, ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"name": ...,
"schema": {...}}}`` (a ``StructuredOutput``, minispec/base/structured_output.py; a schema that does not
compile is a 400 naming ``response_format``, before the engine sees the request). Every choice
carries vLLM's ``stop_reason``: the stop string or stop token id that ended it, else null (a
grammar that allows no next token: "grammar_dead_end"). Used by minispec/serve/app.py; see
docs/production.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from minispec.core.request import LANES, SamplingParams
from minispec.base.structured_output import StructuredOutput

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
               500: "internal_error", 503: "service_unavailable"}
# fields minispec cannot honour beyond their OpenAI default; null or the default is accepted
# ("logprobs": false is chat's default; a completion's logprobs is an integer or null)
UNSUPPORTED = {"n": 1, "best_of": 1, "echo": False, "logprobs": False, "top_logprobs": None, "suffix": None,
               "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "tools": None}


class RequestError(ValueError):
    """A request the server refuses: HTTP ``status`` (400 unless told), ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


def _is_default(value, default) -> bool:
    """``value`` is null or ``default`` itself: a boolean for a boolean, a number for a number."""
    if value is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and value == default
    return False


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object for HTTP ``status``."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


@dataclass
class Limits:
    """What the server allows: its maximum length and whether (and with which k) it speculates."""

    max_model_len: int
    spec_enabled: bool
    default_k: int


@dataclass
class Call:
    """A validated request: what to add to the engine and how to answer."""

    prompt: object             # text, token ids, or chat messages
    params: SamplingParams
    lane: str
    stream: bool
    include_usage: bool
    max_tokens_given: bool


def _typed(body: dict, name: str, types, default=None, what: str = ""):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise RequestError(f"{name}={value!r}: expected {what}", name)
    if not isinstance(value, types):
        raise RequestError(f"{name}={value!r}: expected {what}", name)
    return value


def _or(body: dict, name: str, default):
    value = body.get(name)
    return default if value is None else value


def _prompt(body: dict):
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    raise RequestError("prompt: give one string or one list of token ids (one prompt per request)", "prompt")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: give a non-empty list of {'role': ..., 'content': ...}", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}]: each message needs a string 'role'", "messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise RequestError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content: expected a string or a list of text parts",
                               "messages")
        out.append({"role": m["role"], "content": content})
    return out


def _lane(body: dict) -> str:
    lane = body.get("lane")
    priority = _typed(body, "priority", int, None, "an integer (0 = interactive, above 0 = bulk)")
    if lane is not None and priority is not None:
        raise RequestError("give lane or priority, not both", "lane")
    if priority is not None:
        return LANES[0] if priority <= 0 else LANES[1]
    if lane is None:
        return LANES[0]
    if lane not in LANES:
        raise RequestError(f"lane={lane!r} is unknown: choose one of {', '.join(LANES)}", "lane")
    return lane


def _speculation(body: dict, limits: Limits) -> int | None:
    speculate = _typed(body, "speculate", bool, None, "true or false")
    k = _typed(body, "num_speculative_tokens", int, None, "an integer, 0 (opt out) to 16")
    if speculate is False and k:
        raise RequestError(f"speculate=false contradicts num_speculative_tokens={k}", "speculate")
    if speculate is True and k == 0:
        raise RequestError("speculate=true contradicts num_speculative_tokens=0", "speculate")
    if speculate is False:
        k = 0
    elif speculate is True and k is None:
        k = limits.default_k
    if k and not limits.spec_enabled:
        raise RequestError("this server runs with speculation off (--spec off): start it with --spec "
                           "ngram or --spec draft to let requests speculate", "num_speculative_tokens")
    return k


def _response_format(body: dict) -> StructuredOutput | None:
    """OpenAI's ``response_format`` as a StructuredOutput (None for text or absent).
    Raises: RequestError naming ``response_format`` with the reason."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise RequestError(f"response_format={fmt!r}: expected {{\"type\": \"text\" | \"json_object\" | "
                           f"\"json_schema\"}}", "response_format")
    try:
        if fmt["type"] == "text":
            return None
        if fmt["type"] == "json_object":
            return StructuredOutput("json_object")
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise ValueError("json_schema needs an object with a \"name\" (a string) and a \"schema\"")
        if spec.get("schema") is None:
            raise ValueError(f"json_schema {spec['name']!r} has no \"schema\"")
        return StructuredOutput("json_schema", spec["schema"])
    except ValueError as exc:
        raise RequestError(f"response_format: {exc}", "response_format") from None


def parse_request(body, chat: bool, model_names: tuple[str, ...], limits: Limits) -> Call:
    """Validate a /v1/completions (``chat=False``) or /v1/chat/completions body.

    Args:
        body: the decoded JSON.
        model_names: names this server answers to; the first is the default when ``model`` is absent.
    Returns: a :class:`Call`. Raises: RequestError for anything the server cannot honour.
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model", model_names[0])
    if model not in model_names:
        raise RequestError(f"The model {model!r} does not exist: this server serves {model_names[0]!r}",
                           "model", "model_not_found", status=404)
    for name, default in UNSUPPORTED.items():
        if not _is_default(body.get(name), default):
            raise RequestError(f"{name}={body[name]!r} is not supported by minispec (only null or "
                               f"{default!r})", name)
    prompt = _messages(body) if chat else _prompt(body)
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _typed(body, name, int, None, "an integer >= 1")
    given = max_tokens is not None
    if not given:
        max_tokens = limits.max_model_len if chat else 16  # OpenAI's defaults: to the end / 16
    stop = body.get("stop")
    stop = () if stop is None else (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)):
        raise RequestError(f"stop={stop!r}: expected a string or a list of strings", "stop")
    stream = _typed(body, "stream", bool, False, "true or false")
    options = _typed(body, "stream_options", dict, {}, "an object like {\"include_usage\": true}")
    if options and not stream:
        raise RequestError("stream_options is only allowed with stream=true", "stream_options")
    seed = _typed(body, "seed", int, None, "an integer")
    top_k = _or(body, "top_k", 0)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=_or(body, "temperature", 1.0), top_p=_or(body, "top_p", 1.0),
            top_k=0 if top_k == -1 else top_k, seed=seed, stop=tuple(stop),  # vLLM spells "no top-k" -1
            stop_token_ids=_or(body, "stop_token_ids", ()), min_tokens=_or(body, "min_tokens", 0),
            ignore_eos=_typed(body, "ignore_eos", bool, False, "true or false"),
            num_speculative_tokens=_speculation(body, limits), structured=_response_format(body))
    except RequestError:
        raise
    except ValueError as exc:  # SamplingParams names the field first: "temperature=-1: ..."
        head = str(exc).split("=", 1)[0]
        raise RequestError(str(exc), head if head.isidentifier() else None) from None
    return Call(prompt, params, _lane(body), stream, bool(options.get("include_usage")), given)


class ResponseShape:
    """Builds the JSON objects of one response: whole, or chunk by chunk for streaming.

    Args:
        request_id: the response ``id``.
        model: the served model name.
        chat: chat.completion objects (True) or text_completion objects (False).
    """

    def __init__(self, request_id: str, model: str, chat: bool):
        self.id = request_id
        self.model = model
        self.chat = chat
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(num_prompt_tokens: int, num_output_tokens: int) -> dict:
        return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_output_tokens,
                "total_tokens": num_prompt_tokens + num_output_tokens}

    def role_chunk(self) -> dict:
        """The first chat chunk: the assistant role, no text yet (as OpenAI streams it)."""
        return {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}]}

    def chunk(self, text: str, finish_reason: str | None, stop_reason: int | str | None = None) -> dict:
        """One streamed chunk; the last one carries ``finish_reason`` and vLLM's ``stop_reason``."""
        end = {"finish_reason": finish_reason, "stop_reason": stop_reason}
        if self.chat:
            delta = {"content": text} if text else {}
            return {**self._head("chat.completion.chunk"),
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, **end}]}
        return {**self._head("text_completion"),
                "choices": [{"index": 0, "text": text, "logprobs": None, **end}]}

    def usage_chunk(self, num_prompt_tokens: int, num_output_tokens: int) -> dict:
        """The last chunk when ``stream_options.include_usage`` is set: no choices, only usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(num_prompt_tokens, num_output_tokens)}

    def full(self, text: str, finish_reason: str, num_prompt_tokens: int, num_output_tokens: int,
             stop_reason: int | str | None = None) -> dict:
        """A whole (non-streaming) response; ``stop_reason``: the stop string or id that ended it."""
        usage = self.usage(num_prompt_tokens, num_output_tokens)
        end = {"finish_reason": finish_reason, "stop_reason": stop_reason}
        if self.chat:
            return {**self._head("chat.completion"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                 "logprobs": None, **end}], "usage": usage}
        return {**self._head("text_completion"),
                "choices": [{"index": 0, "text": text, "logprobs": None, **end}], "usage": usage}
