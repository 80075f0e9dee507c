"""The drafter fault guard: a Drafter that wraps another and keeps its faults from costing tokens.

``DrafterGuard`` implements the same ``Drafter`` protocol as the drafter it wraps (minispec/
executor.py), so the executor never knows it is there. A drafter's fault costs no request its
tokens:
- a propose or observe that raises is retried request by request with that request's draft
  state reset; a request whose call fails alone keeps no drafts (it decodes plainly, exactly);
- drafts past the ``num_draft_tokens`` the scheduler reserved blocks and budget for are cut (the
  log says so once); a tree keeps only well-formed nodes no deeper than its depth; drafted ids the
  target cannot embed are cut off;
- a verify that raises, or answers something no verify can (no token, more than k + 1, counts or
  tokens that do not match its drafts, an id outside the vocabulary), falls back to the target's
  own sample at the first position (a full rejection).
It also watches the acceptance rate and warns once when speculation stops paying
(``acceptance_watch.AcceptanceWatch``). Invariant: the requests concerned decode plainly (the target's
token is still emitted) and their neighbours keep drafting.
Read after the core (docs/architecture.md, lifecycle steps 3 and 5).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from minispec.batch import EmittedTokens, ScheduledRequest
from minispec.acceptance_watch import AcceptanceWatch
from minispec.sampling import SeededDraws, next_tokens

log = logging.getLogger("minispec")


class DrafterGuard:
    """A Drafter that runs ``inner`` (any Drafter) and contains its faults (see the module doc).

    Args:
        inner: the drafter that proposes, verifies and observes.
        vocab_size: V of the target: ids outside 0..V-1 are faults.
        watch: warns in the log when speculation stops paying (default: an AcceptanceWatch).
    """

    def __init__(self, inner, vocab_size: int, watch: AcceptanceWatch | None = None):
        self.inner = inner
        self.vocab_size = vocab_size
        self.watch = watch or AcceptanceWatch()
        self._warned_surplus = False  # a drafter that proposes more than reserved is logged once

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        self._each_alone(self.inner.propose, scheduled)
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
            log.warning("the drafter's verify on request %s %s: the target's own token is emitted", r.request_id, fault)
        except Exception:
            log.exception("the drafter's verify failed on request %s: the target's own token is emitted", r.request_id)
        self.inner.free([r.request_id])
        token = next_tokens(target_logits[:1], r.sampling_params, SeededDraws(r.seed, r.num_output_tokens))
        return EmittedTokens(token.tolist(), len(s.draft_token_ids), 0)

    def observe(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens],
                hidden: list[torch.Tensor]) -> None:
        row = {id(s): i for i, s in enumerate(scheduled)}

        def observe(group: list[ScheduledRequest]) -> None:
            rows = [row[id(s)] for s in group]
            self.inner.observe(group, [outputs[i] for i in rows], [hidden[i] for i in rows])

        self._each_alone(observe, scheduled)
        warning = self.watch.observe(outputs)
        if warning:
            log.warning("%s (drafter %s)", warning, type(self.inner).__name__)

    def free(self, request_ids: list[str]) -> None:
        self.inner.free(request_ids)

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
        self.inner.free([s.request.request_id for s in scheduled])
        for s in scheduled:
            try:
                call([s])
            except Exception:
                log.exception("the drafter failed on request %s: it decodes without drafts", s.request.request_id)
                self.inner.free([s.request.request_id])
                s.draft_token_ids, s.draft_probs = [], None

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
            if not (isinstance(p, int) and -1 <= p < i) or (1 if p < 0 else depth[p] + 1) > s.num_speculative_tokens:
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
        path = list(range(out.num_draft_accepted)) if s.draft_parents is None else out.accepted_nodes
        if s.draft_parents is not None and (
                not isinstance(path, list) or len(path) != out.num_draft_accepted
                or any(not (isinstance(n, int) and 0 <= n < len(drafts)) for n in path)
                or any(s.draft_parents[b] != a for a, b in zip([-1] + path, path))):
            return f"returned accepted nodes {path!r}, not a path from the root of its {len(drafts)}-node tree"
        if out.num_draft_proposed != len(drafts) or out.num_draft_accepted != len(tokens) - 1 \
                or tokens[:-1] != [drafts[n] for n in path]:
            return (f"returned {len(tokens)} tokens, {out.num_draft_accepted} accepted of {out.num_draft_proposed}, "
                    f"which do not match its {len(drafts)} drafts")
        if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in tokens):
            return f"returned an id outside 0..{self.vocab_size - 1}"
        return None
