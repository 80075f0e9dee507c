"""Execute a scheduled Batch on a real model: propose -> one packed forward -> verify -> observe.

The loop a reader can follow top to bottom (as in gpt-fast's speculative decode):
1. propose: the drafter fills ``draft_token_ids`` of every request the scheduler gave k > 0;
2. forward: one packed target forward over every request's own tokens plus its drafts;
3. verify: a plain step samples one token; a speculative step asks the drafter to verify its
   drafts against the target's k + 1 distributions (spec/verify.py); a draft tree's accepted
   path, computed at its nodes' slots, has its K/V moved to the positions it now holds;
4. observe: the drafter sees what the step kept (an EAGLE head keeps the target's features: of
   a tree's accepted path only, in path order).
Speculation plugs in through the one ``Drafter`` protocol below; this file never asks which kind
of drafter it holds. A drafter's fault costs no request its tokens: a propose or observe that
raises is retried request by request with that request's draft state reset; drafts past the k
the scheduler reserved blocks and budget for are cut to k (the log says so once), and drafted
ids the target cannot embed are cut off; a verify that raises, or answers something no verify
can (no token, more than k + 1, counts that do not match its drafts, an id outside the
vocabulary), falls back to the target's own sample at the first position (a full rejection).
The requests concerned decode plainly (exactly: the target's token is still emitted) and their
neighbours keep drafting. When speculation stops paying (acceptance rate near 0 over a window of
draft tokens), the log says so once. The simulator's executor (sim/executor.py) answers the same
Batch on a virtual clock.
Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Protocol

import torch

from minispec.batch import Batch, EmittedTokens, ScheduledRequest, StepResult
from minispec.metrics import AcceptanceWatch
from minispec.attention import TreeLayout
from minispec.model_runner import ForwardItem, ModelRunner
from minispec.sampling import SeededDraws, next_tokens

log = logging.getLogger("minispec")


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
        watch: warns in the log when speculation stops paying (default: an AcceptanceWatch).
    """

    def __init__(self, runner: ModelRunner, drafter: Drafter | None = None,
                 clock: Callable[[], float] = time.perf_counter, watch: AcceptanceWatch | None = None):
        self.runner = runner
        self.drafter = drafter
        self.clock = clock
        self.watch = watch or AcceptanceWatch()
        self._warned_surplus = False  # a drafter that proposes more than k is logged once

    @property
    def vocab_size(self) -> int:
        return self.runner.model.cfg.vocab_size

    def execute(self, batch: Batch) -> StepResult:
        t0 = self.clock()
        speculating = [s for s in batch.scheduled if s.num_speculative_tokens > 0]
        if speculating:
            self._each_alone(self.drafter.propose, speculating)
            for s in speculating:
                self._cut_surplus_drafts(s)
                self._cut_invalid_drafts(s)
        t1 = self.clock()
        forward = self.runner.forward([self._item(s) for s in batch.scheduled])
        outputs = [self._emit(s, logits) for s, logits in zip(batch.scheduled, forward.logits)]
        features = [self._keep_path(s, out, f) for s, out, f in zip(batch.scheduled, outputs, forward.features)]
        if self.drafter is not None:
            row = {id(s): i for i, s in enumerate(batch.scheduled)}

            def observe(group: list[ScheduledRequest]) -> None:
                rows = [row[id(s)] for s in group]
                self.drafter.observe(group, [outputs[i] for i in rows], [features[i] for i in rows])

            self._each_alone(observe, batch.scheduled)
        t2 = self.clock()
        if speculating:
            warning = self.watch.observe(outputs)
            if warning:
                log.warning("%s (drafter %s)", warning, type(self.drafter).__name__)
        return StepResult(outputs, draft_time_s=t1 - t0, target_time_s=t2 - t1, forward=forward)

    def _each_alone(self, call: Callable[[list[ScheduledRequest]], None], scheduled: list[ScheduledRequest]) -> None:
        """``call(scheduled)`` (the drafter's propose or observe); if it raises, forget the draft
        state of these requests and call again one request at a time: a request whose call fails
        alone keeps no drafts this step and no draft state (so it decodes plainly, exactly)."""
        try:
            call(scheduled)
            return
        except Exception as exc:
            log.warning("the drafter failed on %d requests (%s: %s): retrying them one by one",
                        len(scheduled), type(exc).__name__, exc)
        self.drafter.free([s.request.request_id for s in scheduled])
        for s in scheduled:
            try:
                call([s])
            except Exception:
                log.exception("the drafter failed on request %s: it decodes without drafts", s.request.request_id)
                self.drafter.free([s.request.request_id])
                s.draft_token_ids, s.draft_probs = [], None

    def _keep_path(self, s: ScheduledRequest, out: EmittedTokens, features: torch.Tensor) -> torch.Tensor:
        """For a draft tree: move its accepted path's K/V from the nodes' slots to the positions
        the path now holds (rejected branches leave nothing the cache counts), and return the
        target's features [T', F] of the request's own tokens and that path, in order. Any other
        request's features are returned as they are (a chain's accepted drafts are already a
        prefix of its rows)."""
        path = out.accepted_nodes
        if s.draft_parents is None or path is None:
            return features
        first = s.request.num_computed_tokens + s.num_own_tokens  # node i was written at first + i
        moved = [(first + n, first + j) for j, n in enumerate(path) if n != j]
        if moved:
            self.runner.move_kv(s.request.request_id, [a for a, _ in moved], [b for _, b in moved])
        rows = list(range(s.num_own_tokens)) + [s.num_own_tokens + n for n in path]
        return features[rows]

    def _cut_surplus_drafts(self, s: ScheduledRequest) -> None:
        """At most k drafts (a drafter bug): the scheduler reserved KV blocks and token budget for
        k, so a surplus would write past the request's blocks or over the step's budget. A tree
        also keeps only well-formed nodes (a parent before each child) no deeper than its depth;
        cutting a tree's node list keeps a tree, since parents come first."""
        if s.draft_parents is not None:
            self._cut_malformed_tree(s)
        k = s.num_speculative_tokens
        if len(s.draft_token_ids) <= k:
            return
        if not self._warned_surplus:
            self._warned_surplus = True
            log.warning("the drafter proposed %d tokens for request %s but k is %d: drafts past k are dropped "
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
            if not (isinstance(p, int) and -1 <= p < i) or (1 if p < 0 else depth[p] + 1) > s.max_draft_depth:
                log.warning("request %s: draft tree node %d has parent %r or lies too deep: its drafts end there",
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

    @staticmethod
    def _item(s: ScheduledRequest) -> ForwardItem:
        """The request's own pending tokens, then its drafts; logits for every row that samples.
        A draft tree's nodes hang under the last own token (TreeLayout: tree attention)."""
        r = s.request
        own = r.all_token_ids[r.num_computed_tokens: r.num_computed_tokens + s.num_own_tokens]
        num_logits = 1 + len(s.draft_token_ids) if s.samples else 0
        tree = None
        if s.draft_parents is not None and s.draft_token_ids:
            o = len(own)
            parents = list(range(-1, o - 1)) + [o - 1 if p < 0 else o + p for p in s.draft_parents]
            tree = TreeLayout.from_parents(r.num_computed_tokens, parents)
        return ForwardItem(r.request_id, own + s.draft_token_ids, r.num_computed_tokens, num_logits, tree)

    def _emit(self, s: ScheduledRequest, logits: torch.Tensor) -> EmittedTokens:
        """Sample a plain step, or have the drafter verify a speculative one (a verify that raises
        or answers something no verify can falls back to the target's own token at the first
        position: a full rejection)."""
        if not s.samples:
            return EmittedTokens([])
        r = s.request
        if s.draft_token_ids:
            try:
                out = self.drafter.verify(s, logits)
                fault = self._verify_fault(s, out)
                if fault is None:
                    return out
                log.warning("the drafter's verify on request %s %s: the target's own token is emitted",
                            r.request_id, fault)
            except Exception:
                log.exception("the drafter's verify failed on request %s: the target's own token is emitted",
                              r.request_id)
            self.drafter.free([r.request_id])
            token = next_tokens(logits[:1], r.sampling_params, SeededDraws(r.seed, r.num_output_tokens))
            return EmittedTokens(token.tolist(), len(s.draft_token_ids), 0)
        draws = SeededDraws(r.seed, r.num_output_tokens)
        return EmittedTokens(next_tokens(logits, r.sampling_params, draws).tolist())

    def _verify_fault(self, s: ScheduledRequest, out) -> str | None:
        """What makes ``out`` an answer no verify of the drafts of ``s`` can give (spec/verify.py's
        invariant: 1 <= emitted <= k + 1, emitted[:-1] == drafts[:accepted], every id in the
        vocabulary), or None. Applied as given, such an answer would move the request's counters
        past its K/V (no token reads as a prompt chunk) or feed the target ids it cannot embed."""
        drafts, tokens = s.draft_token_ids, getattr(out, "token_ids", None)
        if not isinstance(out, EmittedTokens) or not isinstance(tokens, list):
            return f"returned {type(out).__name__}, not EmittedTokens"
        if not 1 <= len(tokens) <= len(drafts) + 1:
            return f"returned {len(tokens)} tokens for {len(drafts)} drafts (1 to {len(drafts) + 1} can be emitted)"
        path = list(range(out.num_accepted)) if s.draft_parents is None else out.accepted_nodes
        if s.draft_parents is not None and (
                not isinstance(path, list) or len(path) != out.num_accepted
                or any(not (isinstance(n, int) and 0 <= n < len(drafts)) for n in path)
                or any(s.draft_parents[b] != a for a, b in zip([-1] + path, path))):
            return f"returned accepted nodes {path!r}, not a path from the root of its {len(drafts)}-node tree"
        if out.num_draft_tokens != len(drafts) or out.num_accepted != len(tokens) - 1 \
                or tokens[:-1] != [drafts[n] for n in path]:
            return (f"returned {len(tokens)} tokens, {out.num_accepted} accepted of {out.num_draft_tokens}, "
                    f"which do not match its {len(drafts)} drafts")
        vocab = self.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in tokens):
            return f"returned an id outside 0..{vocab - 1}"
        return None

    def free(self, request_ids: list[str]) -> None:
        """Drop per-request state held outside the scheduler (the drafter's KV)."""
        if self.drafter is not None:
            self.drafter.free(request_ids)
