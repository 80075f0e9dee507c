"""Iteration-level continuous batching with a token budget, chunked prefill, lanes and preemption.

Each step the scheduler decides which requests ride and how many tokens each computes:
1. running decodes first (1 token each, plus k verify positions when the policy speculates);
2. running prefills continue with the budget that is left (a long prompt spreads over steps);
3. waiting requests are admitted, the most urgent lane first, while budget, ``max_num_seqs`` and
   KV blocks allow, each first chunk filling the rest of the budget.
When blocks run out, speculation is dropped first, then a running request is preempted by
recompute (Kwon et al. 2023, sec. 4.5). Orca (Yu et al. 2022); Sarathi-Serve (Agrawal et al.
2024). ``update`` applies what each request kept after the stop checks (minispec/core/support/stops.py).
Invariants: a step never exceeds ``max_num_batched_tokens``; no request is lost; a finished
request holds no blocks. The scheduler decides; the executors (real or simulated) execute.
Taught in notebooks/02_continuous_batching.ipynb and notebooks/03_chunked_prefill.ipynb.
"""

from __future__ import annotations

from collections import deque

from minispec.core.batch import Batch, KeptTokens, ScheduledRequest
from minispec.core.block_manager import BlockManager
from minispec.base.config import SchedulerConfig
from minispec.core.request import LANES, Request, RequestStatus
from minispec.base.tree_shape import DraftShape

PLAIN = DraftShape(0)  # a step without drafts (shapes are frozen: one serves every request)


def _priority(req: Request) -> tuple[int, float, int]:
    """Scheduling order: lane, arrival, then the order added (equal arrival times included)."""
    return req.lane_rank, req.arrival_time_s, req.arrival_order


class Scheduler:
    """Continuous-batching scheduler shared by the real and the simulated engine.

    Args:
        config: token budget, ``max_num_seqs``, chunked prefill; block_manager: the KV block pool.
        max_model_len: longest sequence in tokens (also caps k near the end).
        policy: a :class:`minispec.speculation.policy.SpecPolicy`, or None for no speculation.
        max_draft_len: the draft model's maximum length, when it is shorter than the target's.
    Raises: ValueError for a budget below max_model_len without chunked prefill.
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int,
                 policy=None, max_draft_len: int | None = None):
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
            raise ValueError(f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_model_len="
                             f"{max_model_len}: without chunked prefill a whole prompt must fit in one step")
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.max_spec_len = min(max_model_len, max_draft_len or max_model_len)
        self.policy = policy
        self.waiting: dict[str, deque[Request]] = {lane: deque() for lane in LANES}
        self.running: list[Request] = []
        self._num_added = 0

    # -- queue management -------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue ``request`` at the tail of its lane, numbering it in the order requests are added."""
        request.arrival_order = self._num_added
        self._num_added += 1
        self.waiting[request.lane].append(request)

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def abort(self, request_id: str, now_s: float, reason: RequestStatus = RequestStatus.FINISHED_ABORTED,
              error: str | None = None) -> Request:
        """Remove a waiting or running request and free its blocks. Raises ValueError if unknown."""
        for group in (*self.waiting.values(), self.running):
            req = next((r for r in group if r.request_id == request_id), None)
            if req is not None:
                group.remove(req)
                self._finish(req, reason, now_s, error)
                return req
        raise ValueError(f"abort: unknown request id {request_id!r} (no waiting or running request has it)")

    # -- one scheduling decision ------------------------------------------------------------
    def schedule(self) -> Batch:
        """Pick this step's requests and token counts, allocating their KV blocks."""
        cfg, bm = self.config, self.block_manager
        budget = cfg.max_num_batched_tokens
        self.running.sort(key=_priority)
        decodes = [r for r in self.running if not r.is_prefill]
        prefills = [r for r in self.running if r.is_prefill]
        # the load a policy weighs: every request held, running or waiting
        decided = self.policy.decide(decodes, len(self.running) + self.num_waiting) if self.policy else {}
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        done: set[str] = set()  # scheduled or preempted this step: not a victim candidate

        for req in decodes:  # 1. running decodes: 1 token plus k verify positions (or a tree's nodes) each
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this step
                continue
            shape = self._clamp(req, decided.get(req.request_id, 0), budget) if self.policy else PLAIN
            size = self._reserve(req, 1, shape.num_draft_tokens, done, preempted)
            if size is not None:
                if size < shape.num_draft_tokens:  # blocks ran short: speculation given up for this step
                    shape = PLAIN
                scheduled.append(ScheduledRequest(req, 1, shape.num_speculative_tokens, shape.draft_topk,
                                                  shape.num_draft_tokens))
                done.add(req.request_id)
                budget -= 1 + shape.num_draft_tokens
        for req in prefills:  # 2. running prefills continue with the budget left (chunked prefill)
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue
            n = min(req.num_pending_tokens, budget)
            if not cfg.enable_chunked_prefill and n < req.num_pending_tokens:
                continue
            if self._reserve(req, n, 0, done, preempted) is not None:
                scheduled.append(ScheduledRequest(req, n, 0, is_prefill=True))
                done.add(req.request_id)
                budget -= n

        # 3. admit waiting requests (``next_waiting``); none after a preemption (avoids thrash)
        num_queried = num_hit = 0
        while budget > 0 and not preempted and len(self.running) < cfg.max_num_seqs:
            req = self.next_waiting()
            if req is None:
                break
            # a waiting request holds no K/V; after a preemption its tokens include its output
            cached = bm.cached_prefix(req.all_token_ids, req.num_tokens - 1)
            num_cached = len(cached) * bm.block_size
            n = min(req.num_tokens - num_cached, budget)
            if not cfg.enable_chunked_prefill and n < req.num_tokens - num_cached:
                break
            if not bm.allocate(req.request_id, num_cached + n, cached):
                break
            self.waiting[req.lane].remove(req)
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached
            if bm.enable_prefix_caching:
                num_queried, num_hit = num_queried + req.num_tokens, num_hit + num_cached
            self.running.append(req)
            scheduled.append(ScheduledRequest(req, n, 0, is_prefill=True))
            budget -= n
        return Batch(scheduled, preempted, num_running=len(self.running), num_waiting=self.num_waiting,
                     num_prefix_query_tokens=num_queried, num_prefix_hit_tokens=num_hit)

    def _reserve(self, req: Request, n: int, k: int, done: set[str], preempted: list[Request]) -> int | None:
        """Allocate blocks for ``n`` own tokens plus ``k`` draft tokens of ``req``; when blocks run out, give
        up speculation (k = 0), then preempt running requests (``pick_victim``). Returns the k reserved, or
        None if ``req`` was preempted."""
        while not self.block_manager.allocate(req.request_id, req.num_computed_tokens + n + k):
            if k > 0:
                k = 0
                continue
            victim = self.pick_victim([r for r in self.running if r.request_id not in done])
            self._preempt(victim)
            preempted.append(victim)
            done.add(victim.request_id)
            if victim is req:
                return None
        return k

    def _clamp(self, req: Request, decision: int | DraftShape, budget: int) -> DraftShape:
        """The policy's k (or tree) for ``req``, clamped (``DraftShape.fit``): its drafts never pass
        max_tokens, the step's budget, or a maximum length (the target's and the draft's: every
        position verifying and drafting write). A request's own ``num_speculative_tokens``
        overrides the policy with a chain."""
        shape = decision if isinstance(decision, DraftShape) else DraftShape(decision)
        override = req.sampling_params.num_speculative_tokens
        if override is not None and self.policy is not None:
            shape = DraftShape(override)
        left_tokens = req.sampling_params.max_tokens - req.num_output_tokens - 1
        left_len = self.max_spec_len - req.num_tokens - 1
        return shape.fit(max_depth=left_tokens, max_nodes=budget - 1, max_positions=left_len)

    def next_waiting(self) -> Request | None:
        """The waiting request to admit next: first come, first served within lanes, the most
        urgent lane first (a preempted request waits at its lane's head). None when none waits."""
        return next((q[0] for q in self.waiting.values() if q), None)

    def pick_victim(self, candidates: list[Request]) -> Request:
        """The running request to preempt when blocks run out: lowest lane, latest arrival (ties:
        added last), among those not yet scheduled this step."""
        return max(candidates, key=_priority)

    def _preempt(self, req: Request) -> None:
        """Preemption by recompute: drop the KV (cached blocks stay findable until evicted), keep
        the tokens, requeue at the lane's head."""
        self.block_manager.free(req.request_id)
        self.running.remove(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting[req.lane].appendleft(req)

    # -- bookkeeping after the executor ran ---------------------------------------------------
    def update(self, batch: Batch, kept: list[KeptTokens], now_s: float) -> list[Request]:
        """Apply a step's kept results (``stops.StopChecker.keep``): advance counters, append
        tokens, finish, free; a result with an ``error`` ends its request with FINISHED_ERROR and
        that reason. Returns the requests that finished.

        Raises: ValueError, before anything is applied, when a request that samples this step (a
        decode, a verify, a prompt's last chunk) kept no token.
        """
        _check_sampled(batch, kept)
        finished = []
        for sched, k in zip(batch.scheduled, kept):
            req, out = sched.request, k.emitted
            if req.finished:
                continue
            if out.error is not None:  # failed alone this step (a GuardedEngine's rerun)
                finished.append(self.abort(req.request_id, now_s, RequestStatus.FINISHED_ERROR, out.error))
                continue
            computed = req.num_computed_tokens
            if not out.token_ids:  # a prompt chunk that does not reach the end
                req.num_computed_tokens += sched.num_own_tokens
                self._cache_blocks(req, computed)
                continue
            # K/V now valid for the pending tokens and the accepted draft tokens only
            req.num_computed_tokens += sched.num_own_tokens + out.num_draft_accepted
            req.synthetic = req.synthetic or out.synthetic
            if out.num_draft_proposed:
                req.count_verify(out)
            if req.first_token_time_s is None:
                req.first_token_time_s = now_s
            req.token_times_s.append(now_s)
            req.output_token_ids += out.token_ids
            self._cache_blocks(req, computed)
            if k.finish is not None:
                req.stop_reason, req.stop_text_len = k.stop_reason, k.stop_text_len
                self.running.remove(req)
                self._finish(req, k.finish, now_s)
                finished.append(req)
            else:
                self.block_manager.trim(req.request_id, req.num_tokens)  # free rejected slots' blocks
        return finished

    def _cache_blocks(self, req: Request, computed_before: int) -> None:
        """Offer the prefix cache the blocks this step filled with final K/V (after the step's
        tokens are appended: an accepted draft's K/V are its token's)."""
        bm = self.block_manager
        if req.num_computed_tokens // bm.block_size > computed_before // bm.block_size:
            bm.cache_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)

    def _finish(self, req: Request, status: RequestStatus, now_s: float, error: str | None = None) -> None:
        req.status = status
        req.error = error
        req.finish_time_s = now_s
        self.block_manager.free(req.request_id)


def _check_sampled(batch: Batch, kept: list[KeptTokens]) -> None:
    """Refuse a step in which a running request that samples kept no token: applied, it would read
    as a prompt chunk and leave the request no token of its own. Raises: ValueError naming it."""
    for sched, k in zip(batch.scheduled, kept):
        req = sched.request
        if sched.samples and not req.finished and not k.emitted.token_ids and k.emitted.error is None:
            step = "a prompt's last chunk" if sched.is_prefill else "a decode"
            raise ValueError(f"update: request {req.request_id!r} ran {step} but kept no token: a step that "
                             "samples must emit at least one (its sampled token, or the target's own after a "
                             "rejected verify); nothing of this step was applied")
