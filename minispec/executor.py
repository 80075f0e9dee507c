"""Execute a scheduled Batch on a real model: propose -> one packed forward -> verify -> observe.

The loop a reader can follow top to bottom (as in gpt-fast's speculative decode):
1. propose: the drafter fills ``draft_token_ids`` of every request the scheduler gave k > 0;
2. forward: one packed target forward over every request's own tokens plus its drafts;
3. verify: a plain step samples one token; a speculative step asks the drafter to verify its
   drafts against the target's k + 1 distributions (spec/verify.py);
4. observe: the drafter sees what the step kept (an EAGLE head keeps the target's features).
Speculation plugs in through the one ``Drafter`` protocol below; this file never asks which kind
of drafter it holds. The simulator's executor (sim/executor.py) answers the same Batch on a
virtual clock. Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

from minispec.batch import Batch, EmittedTokens, ScheduledRequest, StepResult
from minispec.model_runner import ForwardItem, ModelRunner
from minispec.sampling import next_tokens


class Drafter(Protocol):
    """How speculation plugs into an executor (implementations: minispec/spec/drafters.py)."""

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        """Fill ``draft_token_ids`` (at most ``num_speculative_tokens``) and ``draft_probs``."""

    def verify(self, scheduled: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
        """Check the drafts against the target's logits [len(drafts) + 1, V] float32."""

    def observe(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens],
                hidden: list[torch.Tensor]) -> None:
        """See the step's outcome: per request its tokens kept and the target's hidden states."""

    def free(self, request_ids: list[str]) -> None:
        """Forget per-request state (finish, abort, preemption)."""


class ModelExecutor:
    """The real executor: drafter (if any), target forward, then sampling or verification.

    Args:
        runner: the target's ModelRunner.
        drafter: a :class:`Drafter`, or None when speculation is off.
        clock: seconds; ``time.perf_counter`` unless a test passes a fake one.
    """

    def __init__(self, runner: ModelRunner, drafter: Drafter | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.runner = runner
        self.drafter = drafter
        self.clock = clock

    @property
    def vocab_size(self) -> int:
        return self.runner.model.cfg.vocab_size

    def execute(self, batch: Batch) -> StepResult:
        t0 = self.clock()
        speculating = [s for s in batch.scheduled if s.num_speculative_tokens > 0]
        if speculating:
            self.drafter.propose(speculating)
        t1 = self.clock()
        forward = self.runner.forward([self._item(s) for s in batch.scheduled])
        outputs = [self._emit(s, logits) for s, logits in zip(batch.scheduled, forward.logits)]
        if self.drafter is not None:
            self.drafter.observe(batch.scheduled, outputs, forward.hidden)
        t2 = self.clock()
        return StepResult(outputs, draft_time_s=t1 - t0, target_time_s=t2 - t1)

    @staticmethod
    def _item(s: ScheduledRequest) -> ForwardItem:
        """The request's own pending tokens, then its drafts; logits for every row that samples."""
        r = s.request
        own = r.all_token_ids[r.num_computed_tokens: r.num_computed_tokens + s.num_own_tokens]
        num_logits = 1 + len(s.draft_token_ids) if s.samples else 0
        return ForwardItem(r.request_id, own + s.draft_token_ids, r.num_computed_tokens, num_logits)

    def _emit(self, s: ScheduledRequest, logits: torch.Tensor) -> EmittedTokens:
        """Sample a plain step, or have the drafter verify a speculative one."""
        if not s.samples:
            return EmittedTokens([])
        if s.draft_token_ids:
            return self.drafter.verify(s, logits)
        r = s.request
        return EmittedTokens(next_tokens(logits, r.sampling_params, r.generator).tolist())

    def free(self, request_ids: list[str]) -> None:
        """Drop per-request state held outside the scheduler (the drafter's KV)."""
        if self.drafter is not None:
            self.drafter.free(request_ids)
