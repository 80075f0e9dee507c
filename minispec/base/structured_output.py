"""Structured output: what a request's text must match, a JSON schema or a regex, checked on arrival.

A request may carry a ``StructuredOutput`` (``SamplingParams.structured``): a JSON schema, any
JSON object (OpenAI's JSON mode) or a regular expression its whole output must match (OpenAI's
``response_format``; vLLM's ``StructuredOutputsParams``). It is compiled here, once, to a grammar
of llguidance (Microsoft's grammar library: a Rust core, token masks, consume and rollback;
docs/architecture.md says why it was chosen), and checked against a byte-level vocabulary so a
mistake surfaces before the request is queued, never in a step: an invalid schema, one the
library cannot compile, or a pattern that matches no string raises ValueError naming the field.
JSON is generated with fixed separators (``", "`` and ``": "``, as ``json.dumps``) and no other
whitespace: a small model cannot loop on blanks, and the grammar forces more tokens outright
(jump-forward, minispec/structured/grammar_executor.py).
Invariant: a StructuredOutput that exists compiles, and at least one non-empty string matches it.
The engine's side (masks, drafts, rollback) is minispec/structured/grammar.py. Read after the core
(docs/architecture.md, "Structured output").
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

import llguidance

STRUCTURED_KINDS = ("json_schema", "json_object", "regex")
# llguidance's JSON options: json.dumps's separators, no free whitespace (the module doc says why)
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass
class StructuredOutput:
    """A grammar every output token of a request obeys.

    Args:
        kind: "json_schema" (``value``: the schema, a dict or its JSON text), "json_object"
            (``value``: None; any JSON object) or "regex" (``value``: a pattern in Rust's regex
            syntax, matched against the whole output).
        value: as ``kind`` says.
    Attributes: ``grammar``: the compiled grammar (llguidance's JSON text), read by
        ``grammar.StructuredOutputManager``.
    Raises: ValueError naming ``structured`` for an unknown kind, a value of the wrong type, a
        schema that is not JSON or that llguidance cannot compile, a regex that does not parse,
        or a grammar no non-empty string matches.
    """

    kind: str
    value: object = None
    grammar: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(f"structured kind {self.kind!r} is unknown: choose one of "
                             f"{', '.join(STRUCTURED_KINDS)}")
        if self.kind == "regex":
            if not isinstance(self.value, str) or not self.value:
                raise ValueError(f"structured regex={self.value!r}: must be a non-empty pattern string")
            self.grammar = llguidance.LLMatcher.grammar_from_regex(self.value)
        else:
            self.value = self._schema()
            self.grammar = llguidance.LLMatcher.grammar_from_json_schema(self.value, defaults=JSON_OPTIONS)
        self._check()

    def _schema(self) -> dict:
        """The JSON schema to compile: ``value`` parsed if given as text; {"type": "object"} for
        json_object."""
        if self.kind == "json_object":
            if self.value is not None:
                raise ValueError(f"structured json_object takes no value, got {self.value!r}")
            return {"type": "object"}
        schema = self.value
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"structured json_schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise ValueError("structured json_schema must be a JSON object (a dict), got "
                             f"{type(schema).__name__}")
        return schema

    def _check(self) -> None:
        """Compile the grammar over a byte-level vocabulary: errors and unmatchable grammars raise."""
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(self.grammar,
                                                                                 _byte_tokenizer())
        if is_error:
            raise ValueError(f"structured {self.kind} cannot be compiled: {first_line(messages[0])}")
        matcher = llguidance.LLMatcher(_byte_tokenizer(), self.grammar, log_level=0)
        first = matcher.compute_bitmask()  # one bit per id: bytes 0..31 hold the 256 byte ids
        if matcher.is_error() or not any(first[:32]):
            what = "only the empty string" if matcher.is_accepting() else "no string"
            raise ValueError(f"structured {self.kind} {self.describe()} matches {what}: an output "
                             "needs at least one token")

    def describe(self) -> str:
        """A short text for messages and logs: the pattern, or the schema's JSON cut to 80 characters."""
        text = self.value if self.kind == "regex" else json.dumps(self.value)
        return repr(text if len(text) <= 80 else text[:77] + "...")


def check_structured(value) -> StructuredOutput | None:
    """``value`` if it is None or a StructuredOutput. Raises: ValueError naming ``structured``."""
    if value is not None and not isinstance(value, StructuredOutput):
        raise ValueError(f"structured={value!r}: must be None or a StructuredOutput "
                         "(json_schema, json_object, regex)")
    return value


def first_line(message: str) -> str:
    """A grammar error in one line: the first, and after one ending on a colon the reason below it."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()] or ["unknown error"]
    reason = next((line[len("error:"):].strip() for line in lines[1:] if line.startswith("error:")), "")
    return f"{lines[0]} {reason}" if lines[0].endswith(":") and reason else lines[0]


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: grammars are checked without a model."""

    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, text) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


@functools.cache
def _byte_tokenizer():
    """llguidance's tokenizer over ``_Bytes`` (built once: it is immutable)."""
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))
