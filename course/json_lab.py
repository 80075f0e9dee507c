"""The JSON route measured with the engine: structured requests, per drafter, the grammar on and off.

Notebook 08's JSON lab and bench/course/json_routes.py share these helpers, so the course and the
benchmark count the same things the same way:
- ``json_route``: the held-out JSON prompts (data/prompts/json.jsonl) with their schemas
  (data/prompts/json_schemas.jsonl);
- ``measure_json_route``: one closed-loop greedy run of the route on an engine, with the
  acceptance numbers, the step split and how many outputs validate;
- ``use_draft_cut``: the exercise's seam: the engine cuts each draft where the learner's function
  says the grammar first rejects it (``reference_draft_cut`` is the engine's own rule,
  ``StructuredOutputManager.num_valid``).
"""

from __future__ import annotations

import json
import statistics
from typing import Callable

import fastjsonschema

from minispec.speculation.acceptance_watch import AcceptanceWatch
from minispec.tools.summary import StepLog
from minispec.core.request import SamplingParams
from minispec.base.structured_output import StructuredOutput
from minispec.tools.workload import DATA_DIR, load_prompts, run_closed_loop

_validators: dict[str, Callable] = {}  # a schema's compiled validator, by its JSON text

# arm -> (the request carries its schema, SpecConfig.jump_forward)
JSON_ARMS = {"free": (False, False), "grammar": (True, False), "grammar+jump": (True, True)}


def json_route(num: int | None = None) -> list[tuple[list, dict]]:
    """The first ``num`` (all: None) held-out JSON prompts, each a (chat messages, JSON schema) pair."""
    lines = (DATA_DIR / "prompts" / "json_schemas.jsonl").read_text(encoding="utf-8").splitlines()
    schemas = [json.loads(line)["schema"] for line in lines if line.strip()]
    return list(zip(load_prompts("json"), schemas))[:num]


def is_valid_json(text: str, schema: dict) -> bool:
    """True when ``text`` parses as JSON and validates against ``schema``. The validator is
    fastjsonschema (nbformat's own): importing jsonschema builds a URI grammar in lark that the
    kernel then keeps (~20 MB). Raises: fastjsonschema.JsonSchemaDefinitionException for a bad schema."""
    key = json.dumps(schema, sort_keys=True)
    if key not in _validators:
        _validators[key] = fastjsonschema.compile(schema)
    try:
        _validators[key](json.loads(text, parse_constant=int))  # NaN, Infinity: not JSON, int() refuses them
    except ValueError:  # not JSON, or fastjsonschema.JsonSchemaValueException (a ValueError)
        return False
    return True


def measure_json_route(engine, route: list[tuple[list, dict]], concurrency: int, max_tokens: int,
                       grammar: bool) -> dict:
    """One closed-loop greedy run of ``route`` on ``engine`` (after a 4-token warm-up request).

    Args:
        engine: a text engine (it needs the tokenizer) with the drafter and jump-forward to measure.
        route: (prompt, schema) pairs, as ``json_route`` returns them.
        grammar: each request carries its schema (``StructuredOutput("json_schema", ...)``); else
            the prompt alone asks for JSON.
    Returns: a dict: ``throughput_tok_s``; ``acceptance_rate`` (accepted / proposed drafts),
        ``alpha`` (run-based per-position acceptance: accepted / (accepted + first rejections), as
        ``AcceptanceWatch``), ``mean_accepted_length`` (tokens per verify step, bonus included),
        ``forced_per_verify_step`` (jump-forward's drafts), each None without a verify; seconds per
        step: ``step_s``, ``draft_s`` (the drafter's work), ``target_s`` (the target's forward),
        ``grammar_s`` (masks, consume and rollback); ``tokens_per_step``, ``num_valid_json`` of
        ``num_requests``, ``mean_output_tokens``, ``wall_s``.
    """
    structured = [StructuredOutput("json_schema", schema) if grammar else None for _, schema in route]
    warm, _ = run_closed_loop(engine, [route[0][0]], 1, 1, SamplingParams(max_tokens=4, temperature=0.0))
    for r in warm:  # the warm-up request is forgotten, its steps unrecorded
        engine.release(r.request_id)
    engine.reset_prefix_cache()
    manager = engine.grammars
    grammar_s0 = manager.grammar_time_s
    log = engine.add_observer(StepLog())
    watch = AcceptanceWatch(window=1 << 40)  # a window that never closes: the whole run
    engine.add_observer(watch)
    reqs, wall = run_closed_loop(engine, [p for p, _ in route], concurrency, len(route),
                                 lambda i: SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                          structured=structured[i]))
    steps = log.stats
    proposed, accepted = sum(r.num_draft_proposed for r in reqs), sum(r.num_draft_accepted for r in reqs)
    verify_steps, emitted = sum(r.num_verify_steps for r in reqs), sum(r.num_verify_emitted for r in reqs)
    forced = sum(s.num_forced_draft_tokens for s in steps)
    num_tokens = sum(r.num_output_tokens for r in reqs)
    return {"num_requests": len(reqs), "throughput_tok_s": num_tokens / wall,
            "acceptance_rate": accepted / proposed if proposed else None,
            "acceptance_rate_without_forced": (accepted - forced) / (proposed - forced) if proposed > forced
            else None,
            "alpha": watch.alpha, "mean_accepted_length": emitted / verify_steps if verify_steps else None,
            "forced_per_verify_step": forced / verify_steps if verify_steps else None,
            "tokens_per_step": num_tokens / len(steps), "num_steps": len(steps),
            "step_s": statistics.fmean(s.duration_s for s in steps),
            "draft_s": statistics.fmean(s.draft_time_s for s in steps),
            "target_s": statistics.fmean(s.target_time_s for s in steps),
            "grammar_s": (manager.grammar_time_s - grammar_s0) / len(steps),
            "num_valid_json": sum(is_valid_json(engine.text(r), schema) for r,
                                  (_, schema) in zip(reqs, route)),
            "mean_output_tokens": num_tokens / len(reqs), "wall_s": wall}


# -- the exercise: cut a draft at the first token the grammar rejects ---------------------------------
def reference_draft_cut(drafts: list[int], allowed: Callable) -> int:
    """How many of ``drafts`` to keep: the grammar allows each kept one after the ones before it.

    Args:
        drafts: the draft token ids, in order.
        allowed: ``allowed(path)`` -> ``grammar.Allowed`` after the request's output and ``path``
            (a list of drafts the grammar allowed in turn): ``.mask`` [V] bool, ``.ended`` (the
            grammar takes nothing more).
    Returns: i in 0..len(drafts): drafts[i] is the first the grammar rejects (len: none).
    """
    for i, token in enumerate(drafts):
        now = allowed(drafts[:i])
        if now.ended or not (0 <= token < now.mask.numel() and now.mask[token]):
            return i
    return len(drafts)


def use_draft_cut(engine, cut: Callable) -> None:
    """Make ``engine`` cut drafts with ``cut(drafts, allowed) -> int`` (``reference_draft_cut``'s
    contract) wherever it asks how many drafts its grammar allows: the cut before the verify, the
    verify's masks and a masked drafter's. Raises (inside the engine, which fails that request
    alone): ValueError when ``cut`` returns anything but an int in 0..len(drafts)."""
    grammars = engine.grammars

    def num_valid(request, path, tokens):
        tokens = list(tokens)
        n = cut(tokens, lambda p: grammars.allowed(request, list(path) + list(p)))
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(tokens):
            raise ValueError(f"the draft cut returned {n!r} for {len(tokens)} drafts: return an int in "
                             f"0..{len(tokens)}")
        return n
    grammars.draft_cut = num_valid  # the manager's hook: every holder of the manager sees it
