"""Iteration-level continuous batching with a token budget, chunked prefill, lanes and preemption.

Each step the scheduler decides which requests ride and how many tokens each computes:
1. running decodes first (1 token each, plus k verify positions when the policy speculates);
2. running prefills continue with the budget that is left (a long prompt spreads over steps);
3. waiting requests are admitted FCFS within lanes ("interactive" before "bulk") while budget,
   ``max_num_seqs`` and KV blocks allow, their first chunk filling the rest of the budget. With
   prefix caching a request first shares the longest cached prefix of its tokens in whole blocks
   (``BlockManager.cached_prefix``) and starts computing after it: the budget counts only the
   tokens computed, and at least its last token is computed (its logits), so a request never
   writes into a block it shares. Full blocks are registered as their K/V become final.
When blocks run out the lowest-priority, latest-arrived running request is preempted by
recompute: its hold on its blocks is dropped and it re-queues at the head of its lane (Kwon et al.
2023, section 4.5); re-admitted, it finds its own blocks again unless they were evicted. Among
equal arrival times the one added last goes first (a simulator's closed-loop clients arrive at
the same virtual time, and both clocks must pick the same victim). Orca (Yu et al. 2022) for
iteration-level scheduling; Sarathi-Serve (Agrawal et al. 2024) for decode-first chunked
prefill. The scheduler decides; executors (real or simulated) execute; both share this file.
After a step, ``keep`` cuts what each request emitted at the token that ends it (EOS, a stop
token id, a stop string, ``max_tokens``, the maximum length; EOS and stops only from
``min_tokens`` on), and ``update`` applies only that. Invariants: a step never
exceeds ``max_num_batched_tokens``; no request is lost; a finished request holds no blocks; no
token past a stop is kept or counted; no block is written while another request shares it.
Taught in notebooks/02_continuous_batching.ipynb and notebooks/03_chunked_prefill.ipynb.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from minispec.batch import Batch, DraftShape, EmittedTokens, KeptTokens, ScheduledRequest
from minispec.config import SchedulerConfig
from minispec.kv_cache import BlockManager
from minispec.request import LANES, Request, RequestStatus


def _priority(req: Request) -> tuple[int, float, int]:
    """Scheduling order of running requests: lane first, then arrival, then the order they were
    added in (so equal arrival times never leave the order to a list's history)."""
    return req.lane_rank, req.arrival_time_s, req.arrival_order


class Scheduler:
    """Continuous-batching scheduler shared by the real and the simulated engine.

    Args:
        config: token budget, ``max_num_seqs``, chunked prefill on or off.
        block_manager: the KV block pool (bookkeeping only).
        max_model_len: longest sequence in tokens (also caps k near the end).
        policy: a :class:`minispec.spec.policy.SpecPolicy`, or None for no speculation.
        max_draft_len: the draft model's maximum length, when it is shorter than the target's.
        detokenize: ``f(token_ids) -> str``, the output text stop strings are looked for in (None:
            stop strings are never matched, as without a tokenizer).
        eos_token_ids: tokens that end a request (EOS, chat end token).
    """

    def __init__(self, config: SchedulerConfig, block_manager: BlockManager, max_model_len: int,
                 policy=None, max_draft_len: int | None = None,
                 detokenize: Callable[[list[int]], str] | None = None,
                 eos_token_ids: frozenset[int] = frozenset()):
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_model_len="
                f"{max_model_len}: without chunked prefill a whole prompt must fit in one step")
        self.config = config
        self.block_manager = block_manager
        self.max_model_len = max_model_len
        self.max_spec_len = min(max_model_len, max_draft_len or max_model_len)
        self.policy = policy
        self.detokenize = detokenize
        self.eos_token_ids = eos_token_ids
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
        for queue in self.waiting.values():
            for req in queue:
                if req.request_id == request_id:
                    queue.remove(req)
                    self._finish(req, reason, now_s, error)
                    return req
        for req in self.running:
            if req.request_id == request_id:
                self.running.remove(req)
                self._finish(req, reason, now_s, error)
                return req
        raise ValueError(f"abort: unknown request id {request_id!r} (no waiting or running request has it)")

    # -- one scheduling decision ------------------------------------------------------------
    def schedule(self) -> Batch:
        """Pick this step's requests and token counts, allocating their KV blocks."""
        cfg, bm = self.config, self.block_manager
        budget = cfg.max_num_batched_tokens
        self.running.sort(key=_priority)
        decodes: list[Request] = []
        prefills: list[Request] = []
        for r in self.running:
            if r.is_prefill:
                prefills.append(r)
            else:
                decodes.append(r)
        decided = self.policy.decide(decodes, len(self.running)) if self.policy else {}
        scheduled: list[ScheduledRequest] = []
        preempted: list[Request] = []
        done: set[str] = set()  # scheduled or preempted this step: not a victim candidate

        for req in decodes:  # 1. running decodes: 1 token plus k verify positions (or a tree's nodes) each
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this step
                continue
            shape = self._clamp(req, decided.get(req.request_id, 0), budget) if self.policy else DraftShape(0)
            size = self._reserve(req, 1, shape.size, done, preempted)
            if size is not None:
                if size < shape.size:  # blocks ran short: speculation given up for this step
                    shape = DraftShape(0)
                scheduled.append(ScheduledRequest(req, 1, shape.size, draft_depth=shape.depth if shape.is_tree else None,
                                                  draft_topk=shape.topk))
                done.add(req.request_id)
                budget -= 1 + shape.size
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

        # admit waiting requests, most urgent lane first; none after a preemption (avoids thrash)
        num_queried = num_hit = 0
        while budget > 0 and not preempted and len(self.running) < cfg.max_num_seqs:
            req = next((q[0] for q in self.waiting.values() if q), None)
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
            self.waiting[req.lane].popleft()
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
        """Allocate blocks for ``n`` own tokens plus ``k`` draft tokens of ``req``. When blocks run
        out, speculation is given up first (k = 0), then running requests are preempted, lowest
        lane and latest arrival first (ties: the one added last). Returns the k reserved, or None
        when ``req`` itself had to be preempted."""
        while not self.block_manager.allocate(req.request_id, req.num_computed_tokens + n + k):
            if k > 0:
                k = 0
                continue
            victim = self._pick_victim(done)
            self._preempt(victim)
            preempted.append(victim)
            done.add(victim.request_id)
            if victim is req:
                return None
        return k

    def _clamp(self, req: Request, decision: int | DraftShape, budget: int) -> DraftShape:
        """The policy's k (or tree) for ``req``, clamped: its drafts never let the request pass
        max_tokens (a tree's depth), nor the step's budget (every node), nor a maximum length (the
        target's and the draft's: every position the verify and the drafting write, a tree's
        scratch slots included); a clamped tree reserves only the nodes its shape then holds
        (``DraftShape.fit``). A request's own ``num_speculative_tokens`` overrides the policy with
        a chain."""
        shape = decision if isinstance(decision, DraftShape) else DraftShape(decision)
        override = req.sampling_params.num_speculative_tokens
        if override is not None and self.policy is not None:
            shape = DraftShape(override)
        left_tokens = req.sampling_params.max_tokens - req.num_output_tokens - 1
        left_len = self.max_spec_len - req.num_tokens - 1
        return shape.fit(max_depth=left_tokens, max_nodes=budget - 1, max_positions=left_len)

    def _pick_victim(self, done: set[str]) -> Request:
        """Lowest lane, latest arrival (ties: added last) among running requests not yet scheduled
        this step."""
        candidates = [r for r in self.running if r.request_id not in done]
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
    def keep(self, sched: ScheduledRequest, out: EmittedTokens) -> KeptTokens:
        """What the request of ``sched`` keeps of ``out``: its tokens up to and including the first
        that ends it, and the draft counts before it (see ``KeptTokens``). Changes nothing
        (``update`` applies it).

        A token ends a request when, counting it, the output has at least ``min_tokens`` tokens and
        it is EOS (unless ``ignore_eos``), one of ``stop_token_ids``, or completes a stop string; or
        when the output reaches ``max_tokens`` or the sequence ``max_model_len``.
        """
        req = sched.request
        if req.finished or not out.token_ids:
            return KeptTokens(out)
        text = None
        for n in range(1, len(out.token_ids) + 1):
            (finish, reason, text_len), text = self._check_stop(req, out.token_ids[:n], text)
            if finish is not None:
                break
        if n < len(out.token_ids):
            # the stop fell inside the accepted drafts: no bonus is kept, and the token that ends the
            # request stands where the target's own token stood, so the drafts before it count as
            # proposed and accepted and it does not; a verify still keeps its accepted drafts plus
            # one token, and tokens per verify step = 1 + accepted / verify steps holds everywhere
            out = EmittedTokens(out.token_ids[:n], min(out.num_draft_tokens, n - 1), min(out.num_accepted, n - 1),
                                out.synthetic, None if out.accepted_nodes is None else out.accepted_nodes[:n - 1],
                                None if out.draft_depth is None else min(out.draft_depth, n - 1))
        return KeptTokens(out, finish, reason, text_len)

    def _check_stop(self, req: Request, new: list[int], prev_text: str | None):
        """Does the last of ``new`` (tokens after the request's output) end the request?

        Args: prev_text: the text of the output up to ``new[:-1]`` when known (None: decoded here).
        Returns: ((status or None, stop_reason, stop_text_len), the output's text or None).
        """
        params, token = req.sampling_params, new[-1]
        num_output = req.num_output_tokens + len(new)
        text = None
        if num_output >= params.min_tokens:
            if token in self.eos_token_ids and not params.ignore_eos:
                return (RequestStatus.FINISHED_STOPPED, None, None), None
            if token in params.stop_token_ids:
                return (RequestStatus.FINISHED_STOPPED, token, None), None
            if params.stop and self.detokenize is not None:
                output = req.output_token_ids + new
                if prev_text is None:
                    prev_text = self.detokenize(output[:-1])
                text = self.detokenize(output)
                hit = _find_stop(params.stop, text, len(prev_text))
                if hit is not None:
                    return (RequestStatus.FINISHED_STOPPED, hit[1], hit[0]), text
        if num_output >= params.max_tokens or req.num_prompt_tokens + num_output >= self.max_model_len:
            return (RequestStatus.FINISHED_LENGTH, None, None), text
        return (None, None, None), text

    def update(self, batch: Batch, kept: list[KeptTokens], now_s: float) -> list[Request]:
        """Apply a step's kept results (``keep``): advance counters, append tokens, finish, free.
        Returns the requests that finished.

        Raises: ValueError, before anything is applied, when a request that samples this step (a
        decode, a verify, a prompt's last chunk) kept no token (``_check_sampled``).
        """
        _check_sampled(batch, kept)
        finished = []
        for sched, k in zip(batch.scheduled, kept):
            req, out = sched.request, k.emitted
            if req.finished:
                continue
            computed = req.num_computed_tokens
            if not out.token_ids:  # a prompt chunk that does not reach the end
                req.num_computed_tokens += sched.num_own_tokens
                self._cache_blocks(req, computed)
                continue
            # K/V now valid for the pending tokens and the accepted draft tokens only
            req.num_computed_tokens += sched.num_own_tokens + out.num_accepted
            req.synthetic = req.synthetic or out.synthetic
            if out.num_draft_tokens:
                self._count_spec(req, out)
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
        """Register the blocks this step filled with final K/V (after the step's tokens are
        appended: an accepted draft's K/V are its token's)."""
        bm = self.block_manager
        if bm.enable_prefix_caching and req.num_computed_tokens // bm.block_size > computed_before // bm.block_size:
            bm.cache_blocks(req.request_id, req.all_token_ids, req.num_computed_tokens)

    def _count_spec(self, req: Request, out: EmittedTokens) -> None:
        req.num_verify_steps += 1
        req.num_verify_emitted += len(out.token_ids)
        req.num_draft_proposed += out.num_draft_tokens
        req.num_draft_accepted += out.num_accepted
        positions = out.num_draft_tokens if out.draft_depth is None else out.draft_depth  # a tree's: its depths
        grow = positions - len(req.proposed_by_position)
        if grow > 0:
            req.proposed_by_position += [0] * grow
            req.accepted_by_position += [0] * grow
        for i in range(positions):
            req.proposed_by_position[i] += 1
            req.accepted_by_position[i] += i < out.num_accepted

    def _finish(self, req: Request, status: RequestStatus, now_s: float, error: str | None = None) -> None:
        req.status = status
        req.error = error
        req.finish_time_s = now_s
        self.block_manager.free(req.request_id)


def _check_sampled(batch: Batch, kept: list[KeptTokens]) -> None:
    """Refuse a step in which a running request that samples kept no token. Applied, an empty
    output would read as a prompt chunk: ``num_computed_tokens`` would pass the request's last
    token, and the next step would have no token of its own to compute. (The engine's executors
    always emit one, the target's own token after a rejected verify; a hand-written executor may not.)

    Raises: ValueError naming the first such request.
    """
    for sched, k in zip(batch.scheduled, kept):
        req = sched.request
        if sched.samples and not req.finished and not k.emitted.token_ids:
            step = "a prompt's last chunk" if sched.is_prefill else "a decode"
            raise ValueError(f"update: request {req.request_id!r} ran {step} but kept no token: a step that "
                             "samples must emit at least one (the sampled token, or the target's own token "
                             "after a rejected verify); nothing of this step was applied")


def _find_stop(stops: tuple[str, ...], text: str, prev_len: int) -> tuple[int, str] | None:
    """The earliest stop string completed by the text past ``prev_len`` characters (one ending
    there, possibly starting before): (where it starts, which string), or None. Occurrences that
    ended earlier were seen, or ignored below ``min_tokens``, by earlier checks."""
    hits = [(i, stop) for stop in stops if (i := text.find(stop, max(0, prev_len - len(stop) + 1))) >= 0]
    return min(hits) if hits else None
