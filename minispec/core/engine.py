"""The engine: add_request / step / abort, tying scheduler, executor, stop checks and observers.

One step (docs/architecture.md has the whole lifecycle): 1. the scheduler builds a Batch; 2. the
executor drafts, runs one packed forward, samples or verifies (on a wall clock, or the
simulator's virtual one); 3. the stop checks cut each request's tokens at the one that ends it
(minispec/core/support/stops.py); 4. observers get the step's ``StepRecord``; 5. the scheduler
applies what was kept, and finished requests free their blocks. Invariant: every accepted request
ends finished, failed with a reason, or aborted, and then holds no KV block. The builders return a
``GuardedEngine`` (minispec/guard/engine_guard.py). Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from minispec.core.batch import Batch, EmittedTokens, KeptTokens, ScheduledRequest, StepResult
from minispec.base.checks import check_prompt_ids
from minispec.base.config import EngineConfig
from minispec.core.support.metrics import StepStats, request_metrics
from minispec.core.request import Request, RequestOutput, SamplingParams, lane_rank
from minispec.core.scheduler import Scheduler
from minispec.core.support.stops import StopChecker
from minispec.core.support.text import decode, output_text, tokenize


@dataclass
class StepRecord:
    """One engine step as observers see it: the Batch, the kept StepResult, the step's counts."""

    batch: Batch
    result: StepResult
    stats: StepStats


class Engine:
    """Step-by-step inference engine.

    Args:
        config: engine configuration; scheduler: the shared scheduler (owns the BlockManager).
        executor: object with ``execute(batch) -> StepResult`` and ``free(request_ids)``.
        tokenizer: transformers tokenizer, or None (prompts must then be token id lists).
        clock: seconds, the real wall clock or the simulator's virtual one.
        max_model_len: longest sequence in tokens; eos_token_ids: tokens that end a request; stops:
            where outputs end (None: a StopChecker over the tokenizer, max_model_len and eos_token_ids).
    """

    def __init__(self, config: EngineConfig, scheduler: Scheduler, executor, tokenizer=None,
                 clock: Callable[[], float] = time.perf_counter, max_model_len: int = 2048,
                 eos_token_ids: frozenset[int] = frozenset(), stops: StopChecker | None = None):
        self.config = config
        self.scheduler = scheduler
        self.block_manager = scheduler.block_manager
        self.executor = executor
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = max_model_len
        # bind the tokenizer, not the engine: a cycle would keep a dropped engine's KV pool alive
        self.stops = stops or StopChecker(max_model_len, eos_token_ids,
                                          functools.partial(decode, tokenizer) if tokenizer is not None
                                          else None)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.requests: dict[str, Request] = {}
        self._observers: list[Callable[[StepRecord], None]] = []
        self._ids = itertools.count()

    # -- requests -----------------------------------------------------------------------------
    def tokenize(self, prompt) -> list[int]:
        """Raw text, chat messages (list of {"role", "content"}) or token ids -> token ids."""
        return tokenize(self.tokenizer, prompt)

    def check_request(self, prompt, params: SamplingParams, lane: str = "interactive") -> list[int]:
        """The prompt's token ids, or ValueError for an empty prompt, one too long for
        max_model_len, an unknown lane, or a prompt or stop token id outside the vocabulary.
        Queues nothing: a batch checks every prompt before it queues any (minispec/llm.py)."""
        lane_rank(lane)  # raises for an unknown lane
        ids = self.tokenize(prompt)
        vocab_size = getattr(self.executor, "vocab_size", None)
        check_prompt_ids(ids, self.max_model_len, vocab_size, params.stop_token_ids)
        return ids

    def add_request(self, prompt, sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, lane: str = "interactive",
                    arrival_time_s: float | None = None) -> str:
        """Queue a request. Returns its id.

        Raises: ValueError where ``check_request`` does, or for a duplicate request id, before the
            request draws its seed (a refused request changes no neighbour's numbers).
        """
        params = sampling_params or SamplingParams()
        ids = self.check_request(prompt, params, lane)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests and not self.requests[rid].finished:
            raise ValueError(f"request id {rid!r} is already in use by an unfinished request")
        seed = (params.seed if params.seed is not None
                else int(torch.randint(2**62, (1,), generator=self.generator)))
        req = Request(rid, ids, params, self.clock() if arrival_time_s is None else arrival_time_s, lane=lane,
                      seed=seed)
        self.requests[rid] = req
        self.scheduler.add(req)
        return rid

    def abort(self, request_id: str) -> RequestOutput:
        """Abort a waiting or running request; its KV blocks (and draft blocks) come back.
        Raises: ValueError for an id that is not waiting or running."""
        req = self.scheduler.abort(request_id, self.clock())
        self.executor.free([request_id])
        return self._output(req, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``). Raises: ValueError while a
        request holds KV blocks."""
        self.block_manager.reset_prefix_cache()

    def release(self, request_id: str) -> Request:
        """Forget a finished request (a server keeps no history). Returns it.
        Raises: ValueError for an unknown id or a request still waiting or running."""
        req = self.requests.get(request_id)
        if req is None or not req.finished:
            raise ValueError(f"release: request {request_id!r} is not a finished request of this engine")
        return self.requests.pop(request_id)

    # -- observers ------------------------------------------------------------------------------
    def add_observer(self, observer: Callable[[StepRecord], None]) -> Callable[[StepRecord], None]:
        """Call ``observer(record)`` after the executor ran each step, before the scheduler applies
        its results (so each request's counters still describe the step as scheduled). Returns
        the observer (for remove_observer)."""
        self._observers.append(observer)
        return observer

    def remove_observer(self, observer: Callable[[StepRecord], None]) -> None:
        self._observers.remove(observer)

    # -- one iteration --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, execute and apply one step. Returns outputs of requests that changed; their
        ``new_token_ids`` stop at the token that ended them."""
        batch = self.scheduler.schedule()  # 1. schedule
        if batch.preempted:
            self.executor.free([r.request_id for r in batch.preempted])
        if not batch.scheduled:
            return []
        for s in batch.scheduled:
            if s.request.first_scheduled_time_s is None:
                s.request.first_scheduled_time_s = self.clock()
        start = self.clock()
        result = self._execute(batch)  # 2. execute
        now = self.clock()
        kept = [self._keep(s, out) for s, out in zip(batch.scheduled, result.outputs)]  # 3. keep
        result = replace(result, outputs=[k.emitted for k in kept])  # what observers count: kept tokens only
        if self._observers:  # 4. observe, before the results are applied: requests still read as scheduled
            record = StepRecord(batch, result, StepStats.of(batch, result, start, now))
            for observer in self._observers:
                observer(record)
        finished = self.scheduler.update(batch, kept, now)  # 5. update
        if finished:
            self.executor.free([r.request_id for r in finished])
        return [self._output(s.request, k.emitted.token_ids) for s, k in zip(batch.scheduled, kept)
                if k.emitted.token_ids or s.request.finished]

    def _execute(self, batch: Batch) -> StepResult:
        """Run the batch (a GuardedEngine reruns a failing step request by request)."""
        return self.executor.execute(batch)

    def _keep(self, s: ScheduledRequest, out: EmittedTokens) -> KeptTokens:
        """What ``s``'s request keeps of ``out``: the stop checks' cut."""
        return self.stops.keep(s, out)

    # -- outputs ----------------------------------------------------------------------------------
    def text(self, req: Request) -> str:
        """The request's output text: special tokens skipped, cut before the stop string or the
        stop token id that ended it (the id stays in ``output_token_ids``, as in vLLM)."""
        return output_text(self.tokenizer, req)

    def _output(self, req: Request, new_token_ids: list[int]) -> RequestOutput:
        return RequestOutput(
            request_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
            output_token_ids=list(req.output_token_ids), new_token_ids=list(new_token_ids),
            finished=req.finished, finish_reason=req.status.value if req.finished else None,
            stop_reason=req.stop_reason, text=self.text(req) if req.finished else "", error=req.error,
            synthetic=req.synthetic, metrics=request_metrics(req) if req.finished else None)

    def run_until_done(self, progress=None) -> list[RequestOutput]:
        """Step until no request is left; returns the final output of each finished request."""
        final = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
                    if progress is not None:
                        progress.update(1)
        return list(final.values())

    @property
    def num_free_blocks(self) -> int:
        return self.block_manager.num_free_blocks
