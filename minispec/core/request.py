"""A request's life: its sampling parameters, progress counters, and what it has produced.

Invariant: ``num_computed_tokens`` counts the tokens whose K/V sit in the cache, so the tokens a
step must still compute for a request are ``num_tokens - num_computed_tokens`` (vLLM's v1 view: a
prefill and a decode differ only in that number). Taught in notebooks/00_quickstart.ipynb and
notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from minispec.base.checks import check_sampling_params
from minispec.base.structured_output import StructuredOutput, check_structured

LANES = ("interactive", "bulk")  # priority lanes, most urgent first


def lane_rank(lane: str) -> int:
    """Position of ``lane`` in :data:`LANES` (0 is served first). Raises ValueError if unknown."""
    if lane not in LANES:
        raise ValueError(f"lane {lane!r} is unknown: choose one of {', '.join(LANES)}")
    return LANES.index(lane)


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    Args:
        max_tokens: most output tokens, >= 1.
        temperature: 0 means greedy (argmax); > 0 divides the logits before softmax (one so small
            that the distribution collapses samples the argmax: ``sampling.logits_to_probs``).
        top_k: keep the k most likely tokens; 0 keeps all.
        top_p: keep the smallest set of tokens whose probability reaches top_p, in (0, 1]
            (Holtzman et al. 2020, nucleus sampling); the most likely token always stays.
        seed: per-request seed, an integer in base.checks.SEED_RANGE (int64, as vLLM's server takes it); None
            draws one from the engine's generator. Every random number of the request is keyed by
            (seed, output position): its text does not depend on its batches (``SeededDraws``).
        stop: strings that end the output; the stop string itself is not returned.
        stop_token_ids: token ids that end the output (even with ``ignore_eos``); the id stays in
            ``output_token_ids`` but not in the text, as in vLLM.
        ignore_eos: keep going past EOS (for benchmarks with a fixed output length).
        min_tokens: EOS, stop ids and strings count only once the output holds this many tokens.
        num_speculative_tokens: per-request k: None lets the policy decide, 0 opts out.
        structured: a ``StructuredOutput`` (JSON schema, JSON object, regex) every token obeys, or None.
    Raises: ValueError for any value outside these ranges (minispec/base/checks.py).
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    num_speculative_tokens: int | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        self.structured = check_structured(self.structured)
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        self.stop_token_ids = (tuple(self.stop_token_ids) if isinstance(self.stop_token_ids, list)
                               else self.stop_token_ids)
        check_sampling_params(self)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class RequestStatus(enum.Enum):
    WAITING = "waiting"              # queued; holds no KV blocks
    RUNNING = "running"              # scheduled at least once; holds KV blocks
    FINISHED_STOPPED = "stop"        # EOS, chat end token, stop token id or stop string
    FINISHED_LENGTH = "length"       # max_tokens or the model's maximum length
    FINISHED_ABORTED = "abort"       # abort() or a client that went away
    FINISHED_ERROR = "error"         # failed with a reason (see Request.error)

    @property
    def finished(self) -> bool:
        return self._value_ not in ("waiting", "running")  # not the members: read every step


@dataclass
class Request:
    """One request inside the engine. Owned by the scheduler; the executor only reads it.

    Counters (one meaning each): ``num_prompt_tokens``; ``num_output_tokens``;
    ``num_computed_tokens`` = tokens whose K/V are in the cache. Times are seconds on the
    engine's clock (real or virtual).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time_s: float
    lane: str = "interactive"
    seed: int = 0  # keys every random number of the request (minispec.core.sampling.SeededDraws)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    error: str | None = None
    num_preemptions: int = 0
    arrival_order: int = 0  # the scheduler numbers requests as they are added: ties of arrival_time_s
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at its first admission
    synthetic: bool = False  # output came from the synthetic drafter: not model text
    # metrics timestamps
    first_scheduled_time_s: float | None = None
    first_token_time_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)   # one entry per emitting step
    finish_time_s: float | None = None
    # speculation counters
    num_draft_proposed: int = 0
    num_draft_accepted: int = 0
    num_verify_steps: int = 0
    num_verify_emitted: int = 0  # tokens emitted by verify steps, bonus included
    accepted_by_position: list[int] = field(default_factory=list)
    proposed_by_position: list[int] = field(default_factory=list)
    stop_reason: int | str | None = None  # the stop token id or string that ended it (None: EOS, a length)
    stop_text_len: int | None = None  # set when a stop string matched: the output text ends here
    lane_rank: int = field(init=False, default=0)  # position of ``lane`` in LANES (0 is served first)

    def __post_init__(self) -> None:
        self.lane_rank = lane_rank(self.lane)

    def count_verify(self, out) -> None:
        """Count a verify step that kept ``out`` (EmittedTokens) in the acceptance counters: steps, tokens
        emitted, drafts proposed and accepted, and per draft position (a tree's depth) both again."""
        self.num_verify_steps += 1
        self.num_verify_emitted += len(out.token_ids)
        self.num_draft_proposed += out.num_draft_proposed
        self.num_draft_accepted += out.num_draft_accepted
        for counts in (self.proposed_by_position, self.accepted_by_position):  # grown to this step's k
            counts.extend([0] * (out.num_speculative_tokens - len(counts)))
        for i in range(out.num_speculative_tokens):
            self.proposed_by_position[i] += 1
            self.accepted_by_position[i] += i < out.num_draft_accepted

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_pending_tokens(self) -> int:
        """Tokens not yet in the KV cache: the whole prompt at first, 1 while decoding."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than one token is pending (a prompt, or a recompute after preemption)."""
        return self.num_pending_tokens > 1 or self.num_output_tokens == 0

    @property
    def finished(self) -> bool:
        return self.status.finished


@dataclass
class RequestOutput:
    """What the engine returns for a request after a step: ``new_token_ids`` are the tokens it
    kept this step (over the steps they add up to ``output_token_ids``); ``stop_reason`` the stop
    token id or string that ended it (None for EOS, a length or an abort, as vLLM)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None = None
    text: str = ""
    error: str | None = None
    synthetic: bool = False
    metrics: dict | None = None
