"""The drafter fault guard: a Drafter that wraps another and keeps its faults from costing tokens.

``DrafterGuard`` implements the same ``Drafter`` protocol as the drafter it wraps (minispec/
executor.py), so the executor never knows it is there, and every drafter call the engine makes
goes through it. A drafter's fault costs no request its tokens and stays with its request:
- a propose or observe that raises is retried request by request, each request's draft state as
  it is (a draft model counts a catch-up only once its forward ran: ``DraftProgress``); only a
  request whose call fails alone is reset, and it drafts nothing more (it decodes plainly,
  exactly): after a failed observe the drafter has missed what the target kept (an EAGLE head,
  the target features of that step, which only observe writes), so drafting again would read
  rows never written for the request;
- a free that raises is retried request by request, and what a free that fails alone leaves (the
  request's blocks in the draft's pool, its catch-up progress) is taken back by the guard: the
  step goes on and nothing leaks;
- drafts past the ``num_draft_tokens`` the scheduler reserved blocks and budget for are cut (the
  log says so once); a tree keeps only well-formed nodes no deeper than its depth; drafted ids the
  target cannot embed are cut off;
- a verify that raises, or answers something no verify can (no token, more than k + 1, counts or
  tokens that do not match its drafts, an id outside the vocabulary), falls back to the target's
  own sample at the first position (a full rejection).
The warning when speculation stops paying is not the guard's: an engine observer gives it
(minispec/speculation/acceptance_watch.py). Invariant: the requests concerned decode plainly (the target's
token is still emitted) and their neighbours keep their draft state and keep drafting.
Read after the core (docs/architecture.md, lifecycle steps 3 and 5).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.request import Request
from minispec.core.sampling import SeededDraws, next_tokens

log = logging.getLogger("minispec")


class DrafterGuard:
    """A Drafter that runs ``inner`` (any Drafter) and contains its faults (see the module doc).

    Args:
        inner: the drafter that proposes, verifies and observes.
        vocab_size: V of the target: ids outside 0..V-1 are faults.
    """

    def __init__(self, inner, vocab_size: int):
        self.inner = inner
        self.vocab_size = vocab_size
        self._warned_surplus = False  # a drafter that proposes more than reserved is logged once
        self._stopped: dict[str, Request] = {}  # requests that draft no more: a call failed for them alone

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        """The drafter's propose for the requests not stopped from drafting, then the cuts."""
        drafting = [s for s in scheduled if s.request.request_id not in self._stopped]
        failed = self._each_alone(self.inner.propose, drafting) if drafting else []
        for s in failed:
            s.draft_token_ids, s.draft_probs, s.draft_parents = [], None, None
            self._stop(s)
        for s in scheduled:
            self._cut_surplus_drafts(s)
            self._cut_invalid_drafts(s)

    def verify(self, s: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
        r = s.request
        try:
            out = self.inner.verify(s, target_logits)
            fault = self._verify_fault(s, out)
            if fault is None:
                return out
            log.warning("the drafter's verify on request %s %s: the target's own token is emitted",
                        r.request_id, fault)
        except Exception:
            log.exception("the drafter's verify failed on request %s: the target's own token is emitted",
                          r.request_id)
        self._reset([r.request_id])
        token = next_tokens(target_logits[:1], r.sampling_params, SeededDraws(r.seed, r.num_output_tokens))
        return EmittedTokens(token.tolist(), len(s.draft_token_ids), 0)

    def observe(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens],
                hidden: list[torch.Tensor]) -> None:
        row = {s.request.request_id: i for i, s in enumerate(scheduled)}

        def observe(group: list[ScheduledRequest]) -> None:
            rows = [row[s.request.request_id] for s in group]
            self.inner.observe(group, [outputs[i] for i in rows], [hidden[i] for i in rows])

        for s in self._each_alone(observe, scheduled):
            self._stop(s)

    def free(self, request_ids: list[str]) -> None:
        """Forget these requests' draft state (the engine's finish, abort and preemption); never
        raises (``_reset``). A request stopped from drafting stays stopped until it has finished."""
        self._reset(request_ids)
        for rid in request_ids:
            if rid in self._stopped and self._stopped[rid].finished:
                del self._stopped[rid]

    def _each_alone(self, call: Callable[[list[ScheduledRequest]], None],
                    scheduled: list[ScheduledRequest]) -> list[ScheduledRequest]:
        """``call(scheduled)`` (the drafter's propose or observe); if it raises, call again one
        request at a time, leaving each request's draft state as it is. A request whose call fails
        alone loses its draft state. Returns those requests."""
        try:
            call(scheduled)
            return []
        except Exception as exc:
            log.warning("the drafter failed on %d requests (%s: %s): retrying them one by one",
                        len(scheduled), type(exc).__name__, exc)
        failed = []
        for s in scheduled:
            try:
                call([s])
            except Exception:
                log.exception("the drafter failed on request %s: it decodes without drafts from now on",
                              s.request.request_id)
                self._reset([s.request.request_id])
                failed.append(s)
        return failed

    def _stop(self, s: ScheduledRequest) -> None:
        """``s``'s request drafts no more (it decodes plainly, exactly): the guard asks the drafter
        for none of its drafts until it has finished."""
        self._stopped[s.request.request_id] = s.request

    def _reset(self, request_ids: list[str]) -> None:
        """Forget these requests' draft state through the drafter's free; if that raises, free them
        one at a time, and a request whose free fails alone gets what it holds taken back
        (``_take_back``). Never raises: the engine frees after the step's results are applied."""
        try:
            self.inner.free(request_ids)
            return
        except Exception as exc:
            log.warning("the drafter's free failed on %d requests (%s: %s): freeing them one by one",
                        len(request_ids), type(exc).__name__, exc)
        for rid in request_ids:
            try:
                self.inner.free([rid])
            except Exception:
                log.exception("the drafter's free failed on request %s: the guard takes back its draft state",
                              rid)
                self._take_back(rid)

    def _take_back(self, request_id: str) -> None:
        """What a free of ``request_id`` would have dropped, without the drafter's free: its blocks
        in the draft's pool (``block_manager``) and its catch-up progress (``progress``, a
        ``DraftProgress``), where the drafter keeps them (a draft model, an EAGLE head). A drafter
        with per-request state elsewhere must free it itself."""
        progress, pool = getattr(self.inner, "progress", None), getattr(self.inner, "block_manager", None)
        if progress is not None:
            progress.free([request_id])
        if pool is not None:
            pool.free(request_id)

    def _cut_surplus_drafts(self, s: ScheduledRequest) -> None:
        """At most the reserved drafts (a drafter bug): the scheduler reserved KV blocks and token
        budget for ``num_draft_tokens``, so a surplus would write past the request's blocks or over
        the step's budget. A tree also keeps only well-formed nodes (a parent before each child) no
        deeper than its depth; cutting a tree's node list keeps a tree, since parents come first."""
        if s.draft_parents is not None:
            self._cut_malformed_tree(s)
        k = s.num_draft_tokens
        if len(s.draft_token_ids) <= k:
            return
        if not self._warned_surplus:
            self._warned_surplus = True
            log.warning("the drafter proposed %d tokens for request %s but k is %d: drafts past k are "
                        "dropped "
                        "(logged once)", len(s.draft_token_ids), s.request.request_id, k)
        s.draft_token_ids = list(s.draft_token_ids[:k])
        if s.draft_probs is not None:
            s.draft_probs = s.draft_probs[:k]
        if s.draft_parents is not None:
            s.draft_parents = list(s.draft_parents[:k])

    @staticmethod
    def _cut_malformed_tree(s: ScheduledRequest) -> None:
        """A tree's nodes end before the first whose parent is not an earlier node (or -1), or
        that lies deeper than the depth the scheduler allowed (a drafter bug)."""
        depth: list[int] = []
        parents = s.draft_parents
        cut = min(len(parents), len(s.draft_token_ids))
        for i, p in enumerate(parents[:cut]):
            if (not (isinstance(p, int) and -1 <= p < i)
                or (1 if p < 0 else depth[p] + 1) > s.num_speculative_tokens):
                log.warning("request %s: draft tree node %d has parent %r or lies too deep: its drafts end "
                            "there",
                            s.request.request_id, i, p)
                cut = i
                break
            depth.append(1 if p < 0 else depth[p] + 1)
        s.draft_token_ids, s.draft_parents = list(s.draft_token_ids[:cut]), list(parents[:cut])
        if s.draft_probs is not None:
            s.draft_probs = s.draft_probs[:cut] if cut else None

    def _cut_invalid_drafts(self, s: ScheduledRequest) -> None:
        """Drafts end before the first id the target cannot embed (a drafter bug): the prefix is
        still verified exactly, as if the drafter had proposed fewer."""
        vocab = self.vocab_size
        for i, token in enumerate(s.draft_token_ids):
            if not (isinstance(token, int) and 0 <= token < vocab):
                log.warning("request %s: the drafter proposed id %r, outside 0..%d: its drafts end there",
                            s.request.request_id, token, vocab - 1)
                s.draft_token_ids = s.draft_token_ids[:i]
                if s.draft_probs is not None:
                    s.draft_probs = s.draft_probs[:i] if i else None
                if s.draft_parents is not None:
                    s.draft_parents = s.draft_parents[:i]
                return

    def _verify_fault(self, s: ScheduledRequest, out) -> str | None:
        """What makes ``out`` an answer no verify of the drafts of ``s`` can give (core/verify.py's
        invariant: 1 <= emitted <= k + 1, emitted[:-1] == drafts[:accepted], every id in the
        vocabulary), or None. Applied as given, such an answer would move the request's counters
        past its K/V (no token reads as a prompt chunk) or feed the target ids it cannot embed."""
        drafts, tokens = s.draft_token_ids, getattr(out, "token_ids", None)
        if not isinstance(out, EmittedTokens) or not isinstance(tokens, list):
            return f"returned {type(out).__name__}, not EmittedTokens"
        if not 1 <= len(tokens) <= len(drafts) + 1:
            return (f"returned {len(tokens)} tokens for {len(drafts)} drafts (1 to {len(drafts) + 1} can be "
                    "emitted)")
        path = list(range(out.num_draft_accepted)) if s.draft_parents is None else out.accepted_nodes
        if s.draft_parents is not None and (
                not isinstance(path, list) or len(path) != out.num_draft_accepted
                or any(not (isinstance(n, int) and 0 <= n < len(drafts)) for n in path)
                or any(s.draft_parents[b] != a for a, b in zip([-1] + path, path))):
            return (f"returned accepted nodes {path!r}, not a path from the root of its {len(drafts)}-node "
                    "tree")
        if out.num_draft_proposed != len(drafts) or out.num_draft_accepted != len(tokens) - 1 \
                or tokens[:-1] != [drafts[n] for n in path]:
            return (f"returned {len(tokens)} tokens, {out.num_draft_accepted} accepted of "
                    f"{out.num_draft_proposed}, "
                    f"which do not match its {len(drafts)} drafts")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in tokens):
            return f"returned an id outside 0..{self.vocab_size - 1}"
        return None
