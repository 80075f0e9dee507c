"""The engine: add_request / step / abort, tying scheduler, executor, speculation and metrics.

Request lifecycle (docs/architecture.md has the full list):
1. ``add_request`` validates and tokenizes the prompt, then queues a Request in its lane.
2. ``step`` asks the scheduler for a Batch (decodes first, then prompt chunks, within the budget).
3. The executor runs it: drafts for speculating requests, one packed target forward, then
   sampling or verification. The real executor uses a wall clock, the simulator a virtual one.
4. The scheduler cuts each request's tokens at its stop (``Scheduler.keep``) and applies them:
   counters, tokens, finish; finished requests free their blocks, and the executor forgets their
   draft state.
5. ``step`` returns a RequestOutput for every request that gained tokens or finished. An
   ``abort`` asked for during the step (by a drafter or an observer) is applied here, at its end.
One request's failure stays its own: when a step raises, its requests are run again one by one,
and only those that fail alone end with FINISHED_ERROR and the reason; the others go on (a
seeded request draws the same numbers on the second try).
Invariant: every accepted request ends finished, failed with a reason, or aborted, and then holds
no KV block. Watching a step: each step yields one ``StepRecord`` (its Batch, the executor's
StepResult and the step's StepStats), handed to every observer added with ``add_observer``.
Builders: ``minispec.build.build_engine`` (a real model) and ``minispec.sim.build_sim_engine``
(a virtual clock) both go through ``build_scheduler`` here. Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from minispec.batch import Batch, EmittedTokens, KeptTokens, StepResult
from minispec.config import EngineConfig
from minispec.kv_cache import BlockManager, kv_pool_blocks
from minispec.metrics import StepStats, request_metrics
from minispec.request import Request, RequestOutput, RequestStatus, SamplingParams, lane_rank
from minispec.scheduler import Scheduler

log = logging.getLogger("minispec")


@dataclass
class StepRecord:
    """One engine step as observers see it: what was scheduled, what the executor answered, and
    the step's counts and times."""

    batch: Batch
    result: StepResult
    stats: StepStats


class Engine:
    """Step-by-step inference engine. Build it with ``minispec.build.build_engine`` (real model)
    or ``minispec.sim.build_sim_engine`` (virtual clock); both give this class.

    Args:
        config: engine configuration.
        scheduler: the shared scheduler (owns the BlockManager).
        executor: object with ``execute(batch) -> StepResult`` and ``free(request_ids)``.
        tokenizer: transformers tokenizer, or None (prompts must then be token id lists).
        clock: seconds; the real wall clock or the simulator's virtual one.
        max_model_len: longest sequence in tokens.
    """

    def __init__(self, config: EngineConfig, scheduler: Scheduler, executor, tokenizer=None,
                 clock: Callable[[], float] = time.perf_counter, max_model_len: int = 2048):
        self.config = config
        self.scheduler = scheduler
        self.block_manager: BlockManager = scheduler.block_manager
        self.executor = executor
        self.tokenizer = tokenizer
        self.clock = clock
        self.max_model_len = max_model_len
        self.generator = torch.Generator().manual_seed(config.seed)
        self.requests: dict[str, Request] = {}
        self._observers: list[Callable[[StepRecord], None]] = []
        self._ids = itertools.count()
        self._stepping = False  # inside step(): aborts wait for its end (``_aborts``)
        self._aborts: list[str] = []
        if tokenizer is not None:
            # bind the tokenizer, not the engine: a bound method would make engine -> scheduler ->
            # engine a reference cycle, and a dropped engine's KV pool would stay allocated until
            # Python's cycle collector happened to run (a benchmark sweep builds one engine per row)
            scheduler.detokenize = functools.partial(_decode, tokenizer)

    # -- requests -----------------------------------------------------------------------------
    def tokenize(self, prompt) -> list[int]:
        """Raw text, chat messages (list of {"role", "content"}) or token ids -> token ids."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            self._need_tokenizer("chat messages")
            return chat_template_ids(self.tokenizer, prompt)
        if isinstance(prompt, str):
            self._need_tokenizer("a text prompt")
            return self.tokenizer(prompt)["input_ids"] if prompt else []
        if isinstance(prompt, (list, tuple)) and all(map(isinstance, prompt, itertools.repeat(int))):
            return list(prompt)  # (the check runs in C: the simulator adds thousands of long prompts)
        raise ValueError(f"prompt of type {type(prompt).__name__}: give a string, a list of chat "
                         "messages ({'role': ..., 'content': ...}) or a list of token ids")

    def _need_tokenizer(self, what: str) -> None:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer; this engine has none, so pass token ids")

    def add_request(self, prompt, sampling_params: SamplingParams | None = None, request_id: str | None = None,
                    lane: str = "interactive", arrival_time_s: float | None = None) -> str:
        """Queue a request. Returns its id.

        Raises:
            ValueError: empty prompt, prompt too long for max_model_len, unknown lane,
                duplicate request id, or a prompt or stop token id outside the vocabulary. Every
                check runs before the request draws its seed from the engine's generator, so a
                refused request leaves the numbers its neighbours draw as they were.
        """
        params = sampling_params or SamplingParams()
        lane_rank(lane)  # raises for an unknown lane
        ids = self.tokenize(prompt)
        if not ids:
            raise ValueError("prompt is empty: give at least one token")
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}: "
                             f"it must be at most {self.max_model_len - 1} tokens so one output token fits")
        vocab = getattr(self.executor, "vocab_size", None)
        if vocab is not None and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        if vocab is not None and any(t >= vocab for t in params.stop_token_ids):
            raise ValueError(f"stop_token_ids={list(params.stop_token_ids)}: "
                             f"stop_token_ids must be in 0..{vocab - 1}")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests and not self.requests[rid].finished:
            raise ValueError(f"request id {rid!r} is already in use by an unfinished request")
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self.generator))
        req = Request(rid, ids, params, self.clock() if arrival_time_s is None else arrival_time_s, lane=lane,
                      seed=seed)
        self.requests[rid] = req
        self.scheduler.add(req)
        return rid

    def abort(self, request_id: str) -> RequestOutput:
        """Abort a waiting or running request; its KV blocks (and draft blocks) come back.

        Called while a step runs (from a drafter's propose or an observer), the abort is recorded
        and takes effect at the step's end, after the step's results are applied: the executor and
        the scheduler never lose a request in the middle of a step, and the draft blocks a drafter
        allocated for it during the step come back too. The output returned then shows the request
        as it stands (not yet finished); that step's return holds its final, aborted output.

        Raises: ValueError for an id that is not waiting or running (or already aborted in this step).
        """
        if self._stepping:
            req = self.requests.get(request_id)
            if req is None or req.finished or request_id in self._aborts:
                raise ValueError(f"abort: unknown request id {request_id!r} (no waiting or running request has it)")
            self._aborts.append(request_id)
            return self._output(req, [])
        req = self.scheduler.abort(request_id, self.clock())
        self.executor.free([request_id])
        return self._output(req, [])

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (as vLLM's ``reset_prefix_cache``): the next requests start cold.

        Raises: ValueError while a request holds KV blocks.
        """
        self.block_manager.reset_prefix_cache()

    def release(self, request_id: str) -> Request:
        """Forget a finished request (a long-running server keeps no history). Returns it.

        Raises: ValueError for an unknown id or a request that is still waiting or running.
        """
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
        ``new_token_ids`` stop at the token that ended them. Aborts asked for during the step
        (``abort``) are applied at its end, also when the step raises."""
        self._stepping = True
        try:
            outputs = self._step()
        finally:
            self._stepping = False
            aborted = self._apply_aborts()
        if aborted:
            row = {out.request_id: i for i, out in enumerate(outputs)}
            for req in aborted:  # the final output, with the tokens the step gave it before the abort
                i = row.get(req.request_id)
                out = self._output(req, outputs[i].new_token_ids if i is not None else [])
                if i is None:
                    outputs.append(out)
                else:
                    outputs[i] = out
        return outputs

    def _apply_aborts(self) -> list[Request]:
        """Abort the requests ``abort`` recorded during the step that just ended, except those the
        step finished anyway. Returns the requests aborted."""
        aborted = []
        for rid in self._aborts:
            req = self.requests.get(rid)
            if req is not None and not req.finished:
                self.scheduler.abort(rid, self.clock())
                self.executor.free([rid])
                aborted.append(req)
        self._aborts.clear()
        return aborted

    def _step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if batch.preempted:
            self.executor.free([r.request_id for r in batch.preempted])
        if not batch.scheduled:
            return []
        for s in batch.scheduled:
            if s.request.first_scheduled_time_s is None:
                s.request.first_scheduled_time_s = self.clock()
        start = self.clock()
        result, errors = self._execute(batch)
        now = self.clock()
        kept = []
        for s, out in zip(batch.scheduled, result.outputs):
            rid = s.request.request_id
            if rid not in errors:
                try:
                    kept.append(self.scheduler.keep(s, out))
                    continue
                except Exception as exc:  # e.g. a tokenizer that cannot decode this request's ids
                    log.exception("the stop check of request %s failed", rid)
                    errors[rid] = f"{type(exc).__name__}: {exc}"
            kept.append(KeptTokens(EmittedTokens([])))
        result = replace(result, outputs=[k.emitted for k in kept])  # what observers count: kept tokens only
        if self._observers:  # before the results are applied: requests still read as scheduled
            record = StepRecord(batch, result, StepStats.of(batch, result, start, now))
            for observer in self._observers:
                observer(record)
        failed = [self._fail(s.request, errors[s.request.request_id]) for s in batch.scheduled
                  if s.request.request_id in errors]
        finished = self.scheduler.update(batch, kept, now)
        if finished:
            self.executor.free([r.request_id for r in finished])
        return failed + [self._output(s.request, k.emitted.token_ids) for s, k in zip(batch.scheduled, kept)
                         if s.request.request_id not in errors and (k.emitted.token_ids or s.request.finished)]

    def _execute(self, batch: Batch) -> tuple[StepResult, dict[str, str]]:
        """Run the batch; if it raises, run its requests one by one so that only a request that
        fails alone fails. Returns (the step's result, {request id: reason} of the failed)."""
        try:
            return self.executor.execute(batch), {}
        except Exception as exc:
            if len(batch.scheduled) == 1:
                log.exception("step failed")
                return StepResult([EmittedTokens([])]), {batch.scheduled[0].request.request_id: _reason(exc)}
            log.warning("a step of %d requests failed (%s): running them one by one to find the one at fault",
                        len(batch.scheduled), _reason(exc))
        outputs, errors, draft_s, target_s = [], {}, 0.0, 0.0
        for s in batch.scheduled:
            try:
                one = self.executor.execute(Batch([s], num_running=batch.num_running, num_waiting=batch.num_waiting))
            except Exception as exc:
                log.exception("request %s failed", s.request.request_id)
                outputs.append(EmittedTokens([]))
                errors[s.request.request_id] = _reason(exc)
                continue
            outputs.append(one.outputs[0])
            draft_s, target_s = draft_s + one.draft_time_s, target_s + one.target_time_s
        return StepResult(outputs, draft_s, target_s), errors

    def _fail(self, req: Request, reason: str) -> RequestOutput:
        """End ``req`` with FINISHED_ERROR and ``reason``, freeing its blocks and draft state."""
        self.scheduler.abort(req.request_id, self.clock(), RequestStatus.FINISHED_ERROR, reason)
        self.executor.free([req.request_id])
        return self._output(req, [])

    # -- outputs ----------------------------------------------------------------------------------
    def text(self, req: Request) -> str:
        """The request's output text: special tokens skipped, cut before the stop string or the
        stop token id that ended it (the id stays in ``output_token_ids``, as in vLLM)."""
        if self.tokenizer is None:
            return ""
        ids = req.output_token_ids[:-1] if isinstance(req.stop_reason, int) else req.output_token_ids
        text = _decode(self.tokenizer, ids)
        return text if req.stop_text_len is None else text[: req.stop_text_len]

    def _output(self, req: Request, new_token_ids: list[int]) -> RequestOutput:
        finished = req.finished
        return RequestOutput(
            request_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
            output_token_ids=list(req.output_token_ids), new_token_ids=list(new_token_ids),
            finished=finished, finish_reason=req.status.value if finished else None,
            stop_reason=req.stop_reason, text=self.text(req) if finished else "", error=req.error,
            synthetic=req.synthetic, metrics=request_metrics(req) if finished else None)

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


def chat_template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of chat ``messages`` in the tokenizer's chat template (ending with the assistant
    header when ``add_generation_prompt``). transformers returns a list or a BatchEncoding."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _decode(tokenizer, token_ids: list[int]) -> str:
    """Output text of ``token_ids``, special tokens skipped (what stop strings are matched in)."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def _reason(exc: Exception) -> str:
    """An exception as a failed request's reason: its type and message."""
    return f"{type(exc).__name__}: {exc}"


def eos_ids(tokenizer, hf_config) -> frozenset[int]:
    """EOS and chat end tokens: the tokenizer's EOS, the config's, and known end-of-turn markers."""
    ids = set()
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(hf_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(source)
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
            if marker in vocab:
                ids.add(vocab[marker])
    return frozenset(ids)


def build_scheduler(config: EngineConfig, max_model_len: int, kv_bytes_per_token: float, policy=None,
                    max_draft_len: int | None = None, eos_token_ids: frozenset[int] = frozenset(),
                    kv_cache_bytes: float | None = None, memory_follows_use: bool = False) -> Scheduler:
    """The KV block pool and the scheduler over it, as both engine builders make them.

    Args:
        config: block size, pool size (``num_kv_blocks`` or ``kv_cache_bytes``), prefix caching,
            scheduler settings.
        max_model_len: longest sequence in tokens.
        kv_bytes_per_token: bytes one token costs in every pool that grows with the target's (the
            target's K/V plus a draft model's), so the budget covers them all.
        policy, max_draft_len, eos_token_ids: passed to the Scheduler.
        kv_cache_bytes: the budget when ``config.num_kv_blocks`` is None (default
            ``config.kv_cache_bytes``; the simulator passes the device memory left after weights).
        memory_follows_use: see ``BlockManager``; ``kv_cache.memory_follows_use(device_type)`` for
            the device the engine runs on (the real one) or models (the simulator).
    Raises: ValueError when the pool cannot hold one request of ``max_model_len``.
    """
    budget = config.kv_cache_bytes if kv_cache_bytes is None else kv_cache_bytes
    num_blocks = kv_pool_blocks(config.num_kv_blocks, budget, kv_bytes_per_token, config.block_size, max_model_len)
    block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching, memory_follows_use)
    return Scheduler(config.scheduler, block_manager, max_model_len, policy=policy, max_draft_len=max_draft_len,
                     eos_token_ids=eos_token_ids)
