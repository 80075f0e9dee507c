"""Execute a scheduled Batch on a real model: propose -> one packed forward -> verify -> observe.

The loop a reader follows top to bottom (as gpt-fast's speculative decode):
1. propose: the drafter fills ``draft_token_ids`` of every request the scheduler gave k > 0;
2. forward: one packed target forward over every request's own tokens plus its drafts;
3. verify: a plain step samples one token; a speculative step has the drafter verify its drafts
   against the target's k + 1 distributions (core/verify.py);
4. observe: the drafter sees what the step kept (a draft model rolls its K/V back to it).
Invariant: this file never asks which kind of drafter it holds (one ``Drafter`` protocol). Extras:
draft trees (tree_executor.py), the fault guard (drafter_guard.py); the simulator answers the same
Batch on a virtual clock (sim/executor.py).
Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import torch

from minispec.core.batch import Batch, EmittedTokens, ScheduledRequest, StepResult
from minispec.core.model_runner import ForwardItem, ModelRunner
from minispec.core.sampling import SeededDraws, next_tokens


class Drafter(Protocol):
    """How speculation plugs into an executor (implementations: minispec/core/drafters.py)."""

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        """Fill ``draft_token_ids`` (at most ``num_draft_tokens``), ``draft_probs`` and, for a
        tree, ``draft_parents``."""

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
        self._propose([s for s in batch.scheduled if s.num_speculative_tokens > 0])  # 1. propose
        t1 = self.clock()
        forward = self.runner.forward([self._item(s) for s in batch.scheduled])  # 2. forward
        outputs = [self._emit(s, logits) for s, logits in zip(batch.scheduled, forward.logits)]  # 3. verify
        features = [self._keep_path(s, out, f)
                    for s, out, f in zip(batch.scheduled, outputs, forward.features)]
        if self.drafter is not None:  # 4. observe
            self.drafter.observe(batch.scheduled, outputs, features)
        t2 = self.clock()
        return StepResult(outputs, draft_time_s=t1 - t0, target_time_s=t2 - t1, forward=forward)

    def _propose(self, speculating: list[ScheduledRequest]) -> None:
        """The drafter fills the drafts of the requests given k > 0 (none: no draft loop runs)."""
        if speculating:
            self.drafter.propose(speculating)

    def _item(self, s: ScheduledRequest) -> ForwardItem:
        """The request's own pending tokens, then its drafts; logits for every row that samples."""
        r = s.request
        own = r.all_token_ids[r.num_computed_tokens: r.num_computed_tokens + s.num_own_tokens]
        num_logits = 1 + len(s.draft_token_ids) if s.samples else 0
        return ForwardItem(r.request_id, own + s.draft_token_ids, r.num_computed_tokens, num_logits)

    def _emit(self, s: ScheduledRequest, logits: torch.Tensor) -> EmittedTokens:
        """Sample a plain step, or have the drafter verify a speculative one."""
        if not s.samples:
            return EmittedTokens([])  # a prompt chunk that does not reach the end
        if s.draft_token_ids:
            return self.drafter.verify(s, logits)
        r = s.request
        return EmittedTokens(next_tokens(logits, r.sampling_params,
                                         SeededDraws(r.seed, r.num_output_tokens)).tolist())

    def _keep_path(self, s: ScheduledRequest, out: EmittedTokens, features: torch.Tensor) -> torch.Tensor:
        """The target's features [T, F] of the request's rows, for the drafter: a chain's accepted
        drafts are already a prefix of them (a draft tree's path is not: TreeModelExecutor)."""
        return features

    def free(self, request_ids: list[str]) -> None:
        """Drop per-request state held outside the scheduler (the drafter's KV)."""
        if self.drafter is not None:
            self.drafter.free(request_ids)
