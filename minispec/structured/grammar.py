"""Grammar state per request: the tokens a structured output allows next, by draft path.

``StructuredOutputManager`` (vLLM's name) holds one llguidance matcher per request that carries a
``StructuredOutput`` (minispec/base/structured_output.py). A matcher consumes tokens and answers the
token mask for the next position (which ids may follow). A speculative step asks for masks along
its drafts: after the request's output and each prefix of a chain (or the path to each node of a
tree), so the target is masked at every verify position and a drafter can be masked as it drafts.
The matcher walks there by consuming and rolling back: after a verify the accepted drafts are
already consumed and only the rejected suffix is rolled back (llguidance's ``rollback``), exactly;
masks are cached per path for the step. The matcher always follows the request's kept tokens
(``output_token_ids``, which only grow): after a preemption, or should a consume ever fail, it
is rebuilt from them. ``GrammarStopChecker`` ends a request where its grammar ends: complete
(finish "stop", stop_reason None, as EOS) or at a dead end, where no token may follow and the
text does not match (finish "stop", stop_reason ``DEAD_END``); so no step samples from an empty mask.
Invariant: every token a request keeps is one its grammar allowed at that position.
Read after the core (docs/architecture.md, "Structured output").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import llguidance
import llguidance.hf
import torch
# llguidance.numpy, not llguidance.torch: the torch module compiles a kernel with torch.compile at
# import, which loads TorchDynamo (about 115 MB of memory in every process that imports minispec)
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from minispec.base.structured_output import first_line
from minispec.core.batch import EmittedTokens, KeptTokens, ScheduledRequest
from minispec.core.request import Request, RequestStatus
from minispec.core.support.stops import StopChecker, cut_emitted

DEAD_END = "grammar_dead_end"  # stop_reason of a request whose grammar allows no next token


@dataclass
class Allowed:
    """What a grammar allows after some tokens: ``mask`` [V] bool (True: the id may come next),
    ``num_allowed`` its True count, ``ended``: the grammar takes nothing more but EOS;
    ``complete``: the tokens so far match it."""

    mask: torch.Tensor
    num_allowed: int
    ended: bool
    complete: bool


@dataclass
class GrammarState:
    """One request's matcher: it has consumed the first ``num_output`` output tokens, then ``path``
    (draft tokens); ``cache``: what it allows after each path asked for since the output had
    ``cache_at`` tokens."""

    matcher: llguidance.LLMatcher
    num_output: int = 0
    path: list[int] = field(default_factory=list)
    cache: dict[tuple[int, ...], Allowed] = field(default_factory=dict)
    cache_at: int = 0
    after_kept: tuple[int, Allowed] | None = None  # (output length, what it allows) from the stop check


class StructuredOutputManager:
    """Per-request grammar state and token masks (see the module doc).

    Args:
        tokenizer: the engine's transformers tokenizer (a fast one; None: structured requests fail).
        vocab_size: V of the target: masks are [V] bool; ids past the tokenizer's are never allowed.
    ``grammar_time_s``: seconds spent computing masks and consuming and rolling back tokens.
    """

    def __init__(self, tokenizer, vocab_size: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer = None  # built at the first structured request (about half a second)
        self._states: dict[str, GrammarState] = {}
        self.grammar_time_s = 0.0
        self.draft_cut = None  # (request, path, tokens) -> int in place of num_valid's own (an exercise's)

    @staticmethod
    def constrains(request: Request) -> bool:
        """True when ``request`` carries a structured output."""
        return request.sampling_params.structured is not None

    # -- what may come next ---------------------------------------------------------------------
    def allowed(self, request: Request, path: list[int] = ()) -> Allowed:
        """What the grammar allows after the request's output and ``path`` (draft tokens, each
        allowed in turn: check with ``num_valid``). Cached per path until the output grows.
        Raises: ValueError when the engine cannot run the request's grammar (no tokenizer, a slow
            tokenizer) or ``path`` breaks it."""
        state = self._state(request)
        if state.cache_at != request.num_output_tokens:
            state.cache, state.cache_at = {}, request.num_output_tokens
            if state.after_kept is not None and state.after_kept[0] == state.cache_at:
                state.cache[()] = state.after_kept[1]  # the stop check computed it after the last kept tokens
        key = tuple(path)
        found = state.cache.get(key)
        if found is None:
            self._goto(request, state, list(path))
            found = state.cache[key] = self._compute(state)
        return found

    def masks(self, request: Request, paths: list[list[int]]) -> torch.Tensor:
        """[len(paths), V] bool: ``allowed(request, path).mask`` for each path the grammar allows,
        all True for one it rejects (a draft past a rejected token: it is cut before the verify)."""
        return torch.stack([self.allowed(request, p).mask if self.num_valid(request, [], p) == len(p)
                            else torch.ones(self.vocab_size, dtype=torch.bool) for p in paths])

    def num_valid(self, request: Request, path: list[int], tokens: list[int]) -> int:
        """How many of ``tokens``, after the output and ``path``, the grammar allows one after the
        other. Nothing is allowed past the grammar's end (EOS included): a draft stops there."""
        if self.draft_cut is not None:
            return self.draft_cut(request, path, tokens)
        for i, token in enumerate(tokens):
            now = self.allowed(request, list(path) + list(tokens[:i]))
            if now.ended or not (0 <= token < self.vocab_size and now.mask[token]):
                return i
        return len(tokens)

    def forced(self, request: Request, path: list[int], limit: int) -> list[int]:
        """The tokens the grammar forces after the output and ``path``: while it allows exactly one
        id (a key, a brace, a separator), that id; at most ``limit``, never past its end."""
        chain: list[int] = []
        while len(chain) < limit:
            now = self.allowed(request, list(path) + chain)
            if now.ended or now.num_allowed != 1:
                break
            chain.append(int(now.mask.nonzero()[0]))
        return chain

    def end(self, request: Request, tokens: list[int]) -> tuple[int, str | None] | None:
        """Where the grammar ends the output if the request keeps ``tokens`` next: (how many of
        them it keeps, the stop_reason: None when the text is complete, ``DEAD_END`` when no token
        may follow an incomplete one), or None when it goes on. Raises: ValueError for a token
        the grammar does not allow (a kept token always is one)."""
        for n in range(1, len(tokens) + 1):  # the masks of accepted drafts are cached from the verify
            after = self.allowed(request, tokens[:n])
            if after.ended or not after.num_allowed:
                return n, None if after.complete else DEAD_END
        self._state(request).after_kept = (request.num_output_tokens + len(tokens), after)
        return None

    def free(self, request_ids: list[str]) -> None:
        """Forget these requests' matchers (finish, abort, preemption: rebuilt from the kept tokens)."""
        for rid in request_ids:
            self._states.pop(rid, None)

    # -- the matcher follows the request's tokens ---------------------------------------------
    def _state(self, request: Request) -> GrammarState:
        state = self._states.get(request.request_id)
        if state is None:
            state = self._states[request.request_id] = GrammarState(self._new_matcher(request))
        return state

    def _goto(self, request: Request, state: GrammarState, path: list[int]) -> None:
        """Bring ``state`` to the request's output then ``path``: roll back what differs, consume
        the rest. The output only grows, so its new tokens are often the path already consumed."""
        output = request.output_token_ids
        start = time.perf_counter()
        if state.num_output > len(output):
            state.matcher, state.num_output, state.path = self._new_matcher(request), 0, []
        target = output[state.num_output:] + path
        same = 0
        while same < min(len(state.path), len(target)) and state.path[same] == target[same]:
            same += 1
        ok = True
        if same < len(state.path):
            ok = state.matcher.rollback(len(state.path) - same)
        if ok and same < len(target):
            ok = state.matcher.consume_tokens(target[same:])
        if not ok:  # a matcher in its error state: start again from every kept token
            state.matcher = self._new_matcher(request)
            if not state.matcher.consume_tokens(output + path):
                raise ValueError(f"request {request.request_id}: tokens its grammar does not allow: "
                                 f"{first_line(state.matcher.get_error())}")
        state.num_output, state.path = len(output), list(path)
        self.grammar_time_s += time.perf_counter() - start

    def _compute(self, state: GrammarState) -> Allowed:
        """The matcher's next mask (llguidance's bitmask, one bit per id) as [V] bool."""
        start = time.perf_counter()
        fill_next_token_bitmask(state.matcher, self._bitmask_np)
        # [W, 32]: bit j of word w is id 32 w + j
        bits = (self._bitmask[0].unsqueeze(-1) >> self._shifts) & 1
        mask = bits.flatten().bool()[: self._ll_vocab]
        if len(mask) < self.vocab_size:
            mask = torch.cat([mask, mask.new_zeros(self.vocab_size - len(mask))])
        mask = mask[: self.vocab_size]
        num_allowed = int(mask.count_nonzero())
        only_eos = num_allowed == 1 and self._eos < self.vocab_size and bool(mask[self._eos])
        self.grammar_time_s += time.perf_counter() - start
        return Allowed(mask, num_allowed, state.matcher.is_stopped() or only_eos,
                       state.matcher.is_accepting())

    def _new_matcher(self, request: Request) -> llguidance.LLMatcher:
        """A matcher for the request's grammar over the engine's vocabulary. Raises: ValueError."""
        matcher = llguidance.LLMatcher(self._tokenizer(), request.sampling_params.structured.grammar,
                                       log_level=0)
        if matcher.is_error():
            raise ValueError(f"request {request.request_id}: its grammar does not compile for this "
                             f"tokenizer: {first_line(matcher.get_error())}")
        return matcher

    def _tokenizer(self):
        """llguidance's view of the engine's tokenizer, built once. Raises: ValueError without one."""
        if self._ll_tokenizer is None:
            if self.tokenizer is None:
                raise ValueError("structured output needs the engine's tokenizer: this engine has none")
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer)
            except ValueError as exc:
                raise ValueError(f"structured output needs a fast tokenizer: {exc}") from None
            self._ll_vocab, self._eos = self._ll_tokenizer.vocab_size, self._ll_tokenizer.eos_token
            self._bitmask_np = allocate_token_bitmask(1, self._ll_vocab)     # [1, W] int32, W = ceil(V / 32)
            # the same memory, for the bit ops
            self._bitmask = torch.from_numpy(self._bitmask_np)
            self._shifts = torch.arange(32, dtype=torch.int32)
        return self._ll_tokenizer


class GrammarStopChecker(StopChecker):
    """A StopChecker that also ends a structured request where its grammar ends (module doc).

    Args: as StopChecker; grammars: the engine's StructuredOutputManager.
    """

    def __init__(self, max_model_len: int, eos_token_ids: frozenset[int] = frozenset(), detokenize=None,
                 grammars: StructuredOutputManager | None = None):
        super().__init__(max_model_len, eos_token_ids, detokenize)
        self.grammars = grammars

    def keep(self, sched: ScheduledRequest, out: EmittedTokens) -> KeptTokens:
        """As StopChecker.keep; then, for a structured request, the grammar's end cuts the tokens
        (at the same token an EOS, stop id or stop string keeps its own reason; a length does not)."""
        kept = super().keep(sched, out)
        req, tokens = sched.request, kept.emitted.token_ids
        if self.grammars is None or req.finished or not tokens or not self.grammars.constrains(req):
            return kept
        end = self.grammars.end(req, tokens)
        if end is None:
            return kept
        n, reason = end
        if n == len(tokens) and kept.finish is RequestStatus.FINISHED_STOPPED:
            return kept
        return KeptTokens(cut_emitted(kept.emitted, n), RequestStatus.FINISHED_STOPPED, reason)
