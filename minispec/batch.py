"""The types that travel through one engine step: scheduler -> executor -> scheduler -> observers.

1. The scheduler builds a ``Batch``: one ``ScheduledRequest`` per request riding this step, with
   the request's own tokens to compute and the k draft tokens it may verify.
2. The executor (real or simulated) fills in the drafts, runs the step, and answers with a
   ``StepResult``: one ``EmittedTokens`` per scheduled request, plus draft and target time.
3. The scheduler cuts each request's tokens at the one that ends it (``KeptTokens``) and applies
   them; the engine wraps batch, kept result and counts into a ``StepRecord`` for anyone observing
   the step (metrics, traces, the server).
Invariants: a step computes ``Batch.num_tokens`` tokens, never more than the token budget; what a
request keeps ends at its stop, and streams, counters and metrics count only that.
Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minispec.request import Request, RequestStatus
from minispec.tree_shape import fit_tree, tree_shape_error


@dataclass(frozen=True)
class DraftShape:
    """How much one request drafts in one step: a chain of ``depth`` tokens, or a tree of
    ``num_nodes`` nodes, at most ``depth`` deep, at most ``topk`` children per node (the shape
    SGLang's ``--speculative-num-steps / -eagle-topk / -num-draft-tokens`` set).

    Raises: ValueError for a depth below 0, a topk below 1, fewer nodes than the depth, or more
    than the shape holds (``minispec.tree_shape.max_tree_nodes``).
    """

    depth: int
    topk: int = 1
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        error = tree_shape_error(self.depth, self.topk, self.size)
        if error:
            raise ValueError(error)

    @property
    def size(self) -> int:
        """Draft tokens the shape verifies (KV slots and budget it reserves)."""
        return self.depth if self.num_nodes is None else self.num_nodes

    @property
    def is_tree(self) -> bool:
        return self.size > self.depth

    def fit(self, max_depth: int, max_nodes: int, max_positions: int) -> "DraftShape":
        """The largest shape within this one that fits a request's room (``tree_shape.fit_tree``:
        draft positions it may still accept, nodes the budget leaves, positions before a model's
        maximum length that verifying and drafting write); a chain when no tree fits."""
        depth, nodes = fit_tree(self.depth, self.topk, self.size, max_depth, max_nodes, max_positions)
        return DraftShape(depth, self.topk, nodes) if nodes > depth else DraftShape(depth)


@dataclass
class ScheduledRequest:
    """One request's share of a step.

    num_own_tokens: the request's own pending tokens computed now: a prefill chunk, or 1 for a
        decode. Draft tokens come on top of these.
    num_speculative_tokens: draft tokens the request may verify this step (decodes only; 0 = plain
        decode): k for a chain, the tree's size for a draft tree. Its KV blocks and its share of
        the token budget are reserved for them.
    draft_depth: for a draft tree, its deepest level (the most drafts one verify can accept);
        None for a chain, whose depth is ``num_speculative_tokens``.
    draft_topk: children a tree node may get (1 = a chain).
    draft_token_ids: filled by the drafter; may be shorter than reserved (then fewer positions run).
    draft_parents: for a draft tree, the parent of each draft token (an index into
        ``draft_token_ids``, always an earlier one; -1 = a root, which follows the request's last
        token); None for a chain (each draft follows the one before).
    draft_probs: [len(draft_token_ids), V] float32, the distributions a sampling draft model drew
        each draft from (a tree node's: its parent's distribution), or None (greedy requests,
        deterministic drafters).
    is_prefill: frozen at scheduling time (a chunk of k + 1 tokens is still a prefill).
    """

    request: Request
    num_own_tokens: int
    num_speculative_tokens: int = 0
    draft_depth: int | None = None
    draft_topk: int = 1
    draft_token_ids: list[int] = field(default_factory=list)
    draft_parents: list[int] | None = None
    draft_probs: object = None
    is_prefill: bool = False

    @property
    def max_draft_depth(self) -> int:
        """The deepest draft the request may propose: the chain's length or the tree's depth."""
        return self.num_speculative_tokens if self.draft_depth is None else self.draft_depth

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last pending token, so the step samples
        (or verifies) a next token for it; False for a prompt chunk that does not reach the end.
        The real executor, the simulator and the cost model all ask this one question."""
        r = self.request
        return r.num_computed_tokens + self.num_own_tokens == r.num_tokens

    @property
    def num_query_tokens(self) -> int:
        """Q, tokens this request feeds the target this step: its own plus its drafts."""
        return self.num_own_tokens + len(self.draft_token_ids)


@dataclass
class Batch:
    """What one step computes, passed from the scheduler to an executor. With prefix caching on,
    ``num_prefix_query_tokens`` counts the tokens of the requests admitted this step (what they
    looked up in the prefix cache) and ``num_prefix_hit_tokens`` those found there (vLLM's prefix
    cache queries and hits, in tokens); both stay 0 with it off."""

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
    def num_draft_tokens(self) -> int:
        """Draft tokens verified this step (each speculating request adds len(drafts) positions)."""
        return sum(len(s.draft_token_ids) for s in self.scheduled)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_draft_tokens


@dataclass
class EmittedTokens:
    """An executor's answer for one scheduled request: the tokens to append (empty for a prompt
    chunk that does not reach the end) and, for a verify, how many draft tokens were verified and
    how many of them were accepted (the last emitted token is then the correction or bonus).
    For a draft tree, ``accepted_nodes`` lists the accepted path's draft indices, root first
    (``num_accepted`` of them), and ``draft_depth`` its deepest level (the draft positions it
    proposed; ``num_draft_tokens`` counts its nodes, each a verified row); both None for a chain,
    whose accepted drafts are its first ones."""

    token_ids: list[int]
    num_draft_tokens: int = 0
    num_accepted: int = 0
    synthetic: bool = False  # acceptance was drawn, not checked: the tokens are not model text
    accepted_nodes: list[int] | None = None
    draft_depth: int | None = None


@dataclass
class KeptTokens:
    """What a request keeps of its EmittedTokens once the stop checks ran (``Scheduler.keep``).

    emitted: the tokens up to and including the one that ends the request (all of them if none
        does), with the draft counts cut to match: when a verify's stop falls inside its accepted
        drafts, no bonus token is kept and the stop token takes the place of the target's own
        token, so only the drafts before it count as proposed and accepted (a stop at the first
        token leaves a step that kept no draft: it counts as a plain decode). Every kept verify
        thus holds its accepted drafts plus exactly one token, and the mean accepted length is the
        same whether computed as tokens per verify step or as 1 + accepted / verify steps.
        Streams, counters and metrics all read this, never the executor's raw answer.
    finish: the status that ends the request at its last kept token, or None (it goes on).
    stop_reason: the stop token id or stop string that ended it (None for EOS or a length).
    stop_text_len: for a stop string, where the output text ends (characters).
    """

    emitted: EmittedTokens
    finish: RequestStatus | None = None
    stop_reason: int | str | None = None
    stop_text_len: int | None = None


@dataclass
class StepResult:
    """What an executor returns for a Batch: one EmittedTokens per scheduled request, in order,
    plus the seconds spent drafting and in the target forward, and the target forward's own output
    (``minispec.model_runner.ForwardOutput``: logits and last hidden states per scheduled request,
    in order) for observers that learn from it, such as the draft trainer. None on the simulator,
    and when a failing step was rerun request by request."""

    outputs: list[EmittedTokens]
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    forward: object | None = None
