"""Notebook 08's exercises (notebooks/08_json_routes.ipynb): the JSON route's k and break-even alpha
on the simulator, and a draft cut at the grammar run inside the engine.
"""

from __future__ import annotations

import functools

import torch

from course.checks import run_check
from course.exercises.harness import H100, _first_difference
from course.json_lab import json_route, reference_draft_cut, use_draft_cut
from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.structured.grammar import Allowed
from minispec.models.llama import LlamaModel, ModelConfig
from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model
from minispec.core.request import SamplingParams
from minispec.sim import sweep
from minispec.base.structured_output import StructuredOutput


@functools.lru_cache(maxsize=64)
def simulated_tok_s(alpha: float, k: int, concurrency: int = 8, num_requests: int = 128) -> float:
    """Output tokens/s with k drafts (0 = spec off, which does not depend on alpha) at
    ``concurrency`` on the simulated H100 (1B draft). Deterministic for fixed arguments."""
    if k == 0:
        alpha = 0.0  # one spec-off run serves every alpha
    rows = sweep(**H100, alpha=alpha, k=max(k, 1), concurrency=[concurrency], num_requests=num_requests,
                 max_tokens=64, methods="draft" if k else "off")
    return rows[0]["throughput_tok_s"]


def simulated_speedup(alpha: float, k: int, concurrency: int = 8, num_requests: int = 128) -> float:
    """Throughput with k drafts over spec off at ``concurrency`` on the simulated H100 (1B draft)."""
    return (simulated_tok_s(alpha, k, concurrency, num_requests)
            / simulated_tok_s(alpha, 0, concurrency, num_requests))


def check_08_json_route(json_k, break_even_alpha,
                        alpha: float = 0.3, concurrency: int = 8, quiet=False) -> str:
    """The JSON route (acceptance ``alpha``) at ``concurrency``: ``json_k`` (0..6) must be within 5%
    of the best k's throughput, and ``break_even_alpha`` within 0.07 of the alpha where k = 2 starts
    to pay, both on the simulator."""
    def test():
        speed = {k: simulated_speedup(alpha, k, concurrency) for k in range(7)}
        best = max(speed, key=speed.get)
        if json_k not in speed:
            return False, f"json_k={json_k!r}: choose an int in 0..6"
        if speed[json_k] < 0.95 * speed[best]:
            return False, f"k={json_k} gives {speed[json_k]:.2f}x spec off; k={best} gives {speed[best]:.2f}x"
        lo = simulated_speedup(round(break_even_alpha - 0.07, 3), 2, concurrency)
        hi = simulated_speedup(round(break_even_alpha + 0.07, 3), 2, concurrency)
        ok = lo < 1.0 < hi
        return ok, (f"k={json_k}: {speed[json_k]:.2f}x spec off (best k={best}, {speed[best]:.2f}x); k=2 "
                    f"gives {lo:.2f}x at alpha {break_even_alpha - 0.07:.2f} and {hi:.2f}x at "
                    f"{break_even_alpha + 0.07:.2f}"
                    + ("" if ok else ": the break-even alpha is not between them"))
    return run_check("08 the JSON route's k and break-even alpha", test,
                     attempted=json_k is not None and break_even_alpha is not None, quiet=quiet)


def check_08_draft_cut(cut, tokenizer=None, quiet=False) -> str:
    """The JSON lab's exercise: ``cut(drafts, allowed) -> int``, how many drafts to keep before the
    verify (``json_lab.reference_draft_cut``'s contract). Pass when (1) it agrees with the engine's
    rule on small grammars (a draft rejected first, in the middle, past the grammar's end, an id
    outside the vocabulary, no drafts) and (2) inside the engine (a tiny random model over the
    bundled tokenizer, n-gram k 4, the route's JSON schemas, jump-forward off so every draft is
    the drafter's) greedy outputs equal those of the engine's own cut and it keeps the same drafts."""
    def test():
        for drafts, want, why in _TOY_CUTS:
            got = cut(list(drafts), _toy_allowed)
            if got != want:
                return False, f"drafts {list(drafts)} ({why}): returned {got!r}, expected {want}"
        mine, ref = (_cut_run(tokenizer, fn) for fn in (cut, reference_draft_cut))
        if mine["failed"]:
            return False, f"inside the engine a request failed: {mine['failed'][0]}"
        diff = _first_difference(mine["outputs"], ref["outputs"])
        if diff:
            return False, f"inside the engine {diff.replace('plain decoding', 'the engine cut')}"
        if mine["kept"] != ref["kept"]:
            return False, (f"inside the engine it kept {mine['kept']} drafts where the engine's cut keeps "
                           f"{ref['kept']}: "
                           "outputs equal, but every draft cut that the grammar allows is a token the verify "
                           "could have kept")
        return True, (f"{len(_TOY_CUTS)} small cases agree; in the engine the outputs equal "
                      "its own cut's, and of "
                      f"{ref['proposed']} n-gram drafts you kept the same {ref['kept']} for the verify")
    return run_check("08 cut a draft at the grammar", test, attempted=cut is not None, quiet=quiet)


def _toy_allowed(path):
    """A small grammar over ids 0..7: {1, 2}, then {3}, then {4, 5}, then only EOS (id 0, ended)."""
    steps = [{1, 2}, {3}, {4, 5}]
    for i, token in enumerate(path):
        if i >= len(steps) or token not in steps[i]:
            raise ValueError(f"allowed({list(path)}): draft {token} at {i} breaks the grammar; ask only "
                             "about paths it allowed in turn")
    ids = steps[len(path)] if len(path) < len(steps) else {0}
    mask = torch.zeros(8, dtype=torch.bool)
    mask[list(ids)] = True
    return Allowed(mask, len(ids), ended=len(path) >= len(steps), complete=len(path) >= len(steps))


_TOY_CUTS = [((1, 3, 4), 3, "all allowed"), ((2, 5, 4), 1, "the second rejected"),
             ((7, 3), 0, "the first rejected"),
             ((1, 3, 5, 0), 3, "past the grammar's end: nothing is drafted there, not even EOS"),
             ((1, 99), 1, "99 is no id of the vocabulary (8 ids)"), ((), 0, "no drafts")]


class _CountProposed:
    """The engine's drafter, counting the draft tokens it proposes before the grammar's cut."""

    def __init__(self, inner):
        self.inner, self.num_proposed = inner, 0

    def propose(self, scheduled) -> None:
        self.inner.propose(scheduled)
        self.num_proposed += sum(len(s.draft_token_ids) for s in scheduled)

    def __getattr__(self, name):  # verify, observe, free: the drafter's own
        return getattr(self.inner, name)


def _cut_run(tokenizer, cut) -> dict:
    """Greedy constrained n-gram speculation (jump-forward off) of four JSON prompts on a tiny
    random model over the bundled tokenizer, the engine cutting drafts with ``cut``."""
    if tokenizer is None:
        tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
    config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=256, block_size=4, max_model_len=512,
                          kernels="reference", weights="float32", scheduler=SchedulerConfig(max_num_seqs=4),
                          spec=SpecConfig(method="ngram", num_speculative_tokens=4, jump_forward=False))
    engine = build_engine(config, model=LlamaModel.random(ModelConfig.tiny(len(tokenizer)), seed=0),
                          tokenizer=tokenizer)
    use_draft_cut(engine, cut)
    engine.drafter = counter = _CountProposed(engine.drafter)
    ids = [engine.add_request(prompt, SamplingParams(max_tokens=40, temperature=0.0,
                                                     structured=StructuredOutput("json_schema", schema)))
           for prompt, schema in json_route(4)]
    outs = {o.request_id: o for o in engine.run_until_done()}
    reqs = [engine.requests[i] for i in ids]
    return {"outputs": [r.output_token_ids for r in reqs], "kept": sum(r.num_draft_proposed for r in reqs),
            "proposed": counter.num_proposed,
            "failed": [f"{outs[i].finish_reason}: {outs[i].error}" for i in ids
                       if getattr(outs[i], "error", None)]}
