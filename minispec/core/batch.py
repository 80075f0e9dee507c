"""The types that travel through one engine step: scheduler -> executor -> scheduler -> observers.

The scheduler builds a ``Batch`` (one ``ScheduledRequest`` per request riding the step); the
executor, real or simulated, fills in drafts and answers with a ``StepResult`` (one
``EmittedTokens`` per request); the stop checks cut each to what the request keeps
(``KeptTokens``), which the scheduler applies. Invariant: a step computes ``Batch.num_tokens``
tokens, never more than the token budget.
Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minispec.core.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    num_own_tokens: the request's own pending tokens computed now: a prefill chunk, or 1.
    num_speculative_tokens: k, the draft positions the request may verify (decodes only; 0 = a
        plain decode): a chain's length, a draft tree's depth (the most drafts one verify accepts).
    draft_topk: children a tree node may get (1 = a chain).
    num_draft_tokens: draft tokens reserved (KV slots, budget): k for a chain (None), a tree's nodes.
    draft_token_ids: filled by the drafter; may be shorter than reserved (then fewer positions run).
    draft_parents: for a draft tree, each draft's parent (an earlier draft's index, or -1: under
        the request's last token); None for a chain.
    draft_probs: [len(draft_token_ids), V] float32, the distributions a sampling draft model drew
        the drafts from, or None (greedy requests, deterministic drafters).
    is_prefill: frozen at scheduling time (a chunk of k + 1 tokens is still a prefill).
    num_catch_up_tokens: filled by a draft model: tokens it caught up on first (``DraftProgress``).
    num_forced_draft_tokens: drafts a grammar forced, proposed without a draft forward (grammar_executor.py).
    """

    request: Request
    num_own_tokens: int
    num_speculative_tokens: int = 0
    draft_topk: int = 1
    num_draft_tokens: int | None = None
    draft_token_ids: list[int] = field(default_factory=list)
    draft_parents: list[int] | None = None
    draft_probs: object = None
    is_prefill: bool = False
    num_catch_up_tokens: int = 0
    num_forced_draft_tokens: int = 0

    def __post_init__(self) -> None:
        if self.num_draft_tokens is None:
            self.num_draft_tokens = self.num_speculative_tokens

    @property
    def is_tree(self) -> bool:
        """True when the request drafts a tree (more nodes than positions) this step."""
        return self.num_draft_tokens > self.num_speculative_tokens

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last pending token, so it samples (or
        verifies) a next token; False for a prompt chunk that does not reach the end."""
        r = self.request
        return r.num_computed_tokens + self.num_own_tokens == r.num_tokens

    @property
    def num_query_tokens(self) -> int:
        """Q, tokens this request feeds the target this step: its own plus its drafts."""
        return self.num_own_tokens + len(self.draft_token_ids)


@dataclass
class Batch:
    """What one step computes, passed from the scheduler to an executor. With prefix caching,
    the tokens the requests admitted this step looked up and found (vLLM's queries and hits)."""

    scheduled: list[ScheduledRequest]
    preempted: list[Request] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_own_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_own_tokens for s in self.scheduled if not s.is_prefill)

    @property
    def num_draft_proposed(self) -> int:
        """Draft tokens verified this step (each a row of the target forward)."""
        return sum(len(s.draft_token_ids) for s in self.scheduled)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_proposed


@dataclass
class EmittedTokens:
    """An executor's answer for one scheduled request: the tokens to append (none for a prompt
    chunk that does not reach the end) and, for a verify, the drafts proposed and accepted (the
    last token is then the correction or bonus). accepted_nodes: a tree's accepted path, root
    first (None for a chain); num_speculative_tokens: the positions proposed (a tree's depth;
    None: ``num_draft_proposed``, a chain); error: why the request failed this step (set by a
    GuardedEngine, minispec/guard/engine_guard.py; the scheduler ends it with FINISHED_ERROR)."""

    token_ids: list[int]
    num_draft_proposed: int = 0
    num_draft_accepted: int = 0
    synthetic: bool = False  # acceptance was drawn, not checked: the tokens are not model text
    accepted_nodes: list[int] | None = None
    num_speculative_tokens: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.num_speculative_tokens is None:
            self.num_speculative_tokens = self.num_draft_proposed


@dataclass
class KeptTokens:
    """What a request keeps of its EmittedTokens once the stop checks ran (minispec/core/support/stops.py):
    the tokens up to the one that ends it, draft counts cut to match; the status that ends it
    (None: it goes on); the stop token id or string; where a stop string cuts the text (chars)."""

    emitted: EmittedTokens
    finish: RequestStatus | None = None
    stop_reason: int | str | None = None
    stop_text_len: int | None = None


@dataclass
class StepResult:
    """What an executor returns for a Batch: one EmittedTokens per scheduled request, in order,
    the seconds spent drafting and in the target forward, and the forward's ``ForwardOutput``
    for observers that learn from it (the draft trainer; None on the simulator)."""

    outputs: list[EmittedTokens]
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    forward: object | None = None
