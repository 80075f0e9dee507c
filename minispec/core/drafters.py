"""Drafters propose up to k tokens for each speculating request of a step, as a chain.

- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM's n-gram proposer): copy what followed the
  latest earlier occurrence of the request's last n tokens. Free to run; deterministic.
- ``DraftModelDrafter``: a small LM with its own paged KV cache and the target's tokenizer
  (Leviathan et al. 2023; Chen et al. 2023): it catches up on the tokens it has not seen, then
  drafts one token per forward, the step's requests packed together; rejected positions are
  rolled back at the verify that rejected them (``DraftProgress.truncate``).
Both implement the executor's ``Drafter`` protocol. Invariant: a drafter proposes at most the k
reserved; fewer (even 0) just makes the verify shorter. Extras: trees (speculation/tree_drafters.py),
the EAGLE head (speculation/eagle.py), the synthetic drafter (speculation/synthetic.py).
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.block_manager import BlockManager
from minispec.core.model_runner import ForwardItem, ModelRunner
from minispec.models.draft import to_target_vocab
from minispec.core.request import Request
from minispec.core.sampling import DRAFT_DRAW, logits_to_probs
from minispec.core.verify import request_draws, verify_exact


class BaseDrafter:
    """The protocol's defaults: exact verification, nothing to observe, no per-request state."""

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        raise NotImplementedError

    def verify(self, scheduled: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
        return verify_exact(scheduled, target_logits)

    def observe(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens],
                hidden: list[torch.Tensor]) -> None:
        pass

    def free(self, request_ids: list[str]) -> None:
        pass


class DraftProgress:
    """How many tokens of each request a draft model's KV cache holds: its catch-up and rollback.

    The draft keeps only K/V the target kept (``truncate``, after every target step), then catches up
    on the tokens it has not seen (a step's catch-ups share the token budget: one that does not fit
    runs a chunk, its request decoding plainly until caught up, ``grant``) and drafts k - 1 more.
    The real drafter and the simulator share this bookkeeping. Invariant: after every step
    ``num_cached`` counts only draft K/V of committed tokens, each once its forward ran (``count_run``);
    the rollback happens at the verify itself (a later plain step would hide the rejected positions).
    """

    def __init__(self, max_catch_up_tokens: int | None = None):
        self.num_cached: dict[str, int] = {}
        self.granted: dict[str, int] = {}  # catch-up tokens granted this step whose forward has not run
        self.max_catch_up_tokens = self.budget_left = max_catch_up_tokens or float("inf")

    def truncate(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens]) -> None:
        """After a target step: each request's draft keeps K/V only up to the tokens the target
        keeps (its own tokens of the step and the accepted drafts). The next step's budget is full."""
        self.budget_left, self.granted = self.max_catch_up_tokens, {}
        for s, out in zip(scheduled, outputs):
            rid = s.request.request_id
            if rid in self.num_cached:
                kept = s.request.num_computed_tokens + s.num_own_tokens + out.num_draft_accepted
                self.num_cached[rid] = min(self.num_cached[rid], kept)

    def begin(self, request: Request, num_tokens: int) -> tuple[int, int]:
        """Start a request's proposal: roll back (``rollback``), then grant a catch-up over its
        tokens from the draft's up to ``num_tokens`` (a draft model runs them all; an EAGLE head
        all but the last). Returns (tokens the draft holds, tokens of catch-up granted)."""
        done = min(self.rollback(request), num_tokens - 1)
        self.num_cached[request.request_id] = done
        return done, self.grant(request.request_id, num_tokens - done)

    def grant(self, request_id: str, pending: int) -> int:
        """Tokens of a catch-up of ``pending`` the draft runs this step: all while the budget lasts."""
        n = min(pending, self.budget_left)
        self.budget_left -= n
        self.granted[request_id] = n
        return n

    def rollback(self, request: Request) -> int:
        """Drop draft K/V past what the target holds (a step that failed never reached ``truncate``)
        and take back a grant whose forward raised. Returns the tokens still valid in the draft."""
        self.budget_left += self.granted.pop(request.request_id, 0)
        done = min(self.num_cached.get(request.request_id, 0), request.num_computed_tokens)
        self.num_cached[request.request_id] = done
        return done

    def count_run(self, request_id: str, num_tokens: int) -> None:
        """The draft ran ``num_tokens`` more tokens of this request (its grant is spent)."""
        self.granted.pop(request_id, None)
        self.num_cached[request_id] += num_tokens

    def free(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.num_cached.pop(rid, None)


class NgramDrafter(BaseDrafter):
    """Prompt lookup: match the last n tokens earlier in the sequence, copy what followed."""

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, scheduled) -> None:
        for s in scheduled:
            s.draft_token_ids = self.lookup(s.request.all_token_ids, s.num_speculative_tokens)
            s.draft_parents = s.draft_probs = None

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens following the latest earlier match of the longest suffix n-gram."""
        continuations = self.matches(tokens, k, 1)
        return continuations[0] if continuations else []

    def matches(self, tokens: list[int], k: int, limit: int) -> list[list[int]]:
        """Up to k tokens after each of the ``limit`` latest earlier matches of the longest suffix n-gram that
        matches (latest first)."""
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            suffix = tokens[-n:]
            found = []
            for start in range(len(tokens) - n - 1, -1, -1):
                # the last token first: most starts fail this cheap test (microseconds per lookup)
                if tokens[start + n - 1] == suffix[-1] and tokens[start: start + n] == suffix:
                    found.append(tokens[start + n: start + n + k])
                    if len(found) == limit:
                        break
            if found:
                return found
        return []


class DraftModelDrafter(BaseDrafter):
    """A draft LM with its own KV cache (no prefix caching: its K/V never depend on another
    request's), driven with the same packed runner as the target.

    Args:
        runner: the draft's ModelRunner (its own KV and block pool); target_vocab_size: V.
        vocab_map: optional [V_draft] long tensor of target ids: a draft whose LM head covers a
            subset of the target's vocabulary (FR-Spec, Zhao et al. 2025; ``to_target_vocab``).
        confidence_threshold: in [0, 1): drafting stops at the first position where the draft's
            top probability is below it (``SpecConfig.draft_confidence_threshold``).
        max_catch_up_tokens: a step's catch-up budget (``DraftProgress``; the token budget).
        mask_logits: (s, logits [M, V_draft], paths) -> logits, applied to every row of draft
            logits first: structured output's masks (minispec/structured/grammar_executor.py).
    """

    def __init__(self, runner: ModelRunner, target_vocab_size: int, vocab_map: torch.Tensor | None = None,
                 confidence_threshold: float = 0.0, max_catch_up_tokens: int | None = None, mask_logits=None):
        self.runner, self.target_vocab_size, self.vocab_map = runner, target_vocab_size, vocab_map
        self.confidence_threshold, self.mask_logits = confidence_threshold, mask_logits
        self.progress = DraftProgress(max_catch_up_tokens)
        self.num_embeddings = runner.model.embed_tokens.shape[0]
        self.block_manager: BlockManager = runner.block_manager  # the draft's own block pool

    def propose(self, scheduled) -> None:
        """A chain per request: one catch-up forward over the tokens the draft has not seen (its
        last row drafts position 0, unless a chunk), then one forward per further position j, run
        at the draft's own position n + j of each request still drafting."""
        live = [(s, item) for s in scheduled for item in [self.start(s)] if item is not None]
        if not live:
            return
        forward = self.runner.forward([item for _, item in live])
        for s, _ in live:  # counted once run: a forward that raised leaves the progress as it was
            self.progress.count_run(s.request.request_id, s.num_catch_up_tokens)
        rows = [(s, logits) for (s, _), logits in zip(live, forward.logits) if len(logits)]
        probs: dict[str, list] = {s.request.request_id: [] for s, _ in live}
        for j in range(max(s.num_speculative_tokens for s, _ in live)):
            drafting = []  # requests that drafted position j and go on to j + 1
            for s, logits in rows:
                drafted = self.next_token(s, self.next_dist(s, logits)[0], j)
                if drafted is None:
                    continue  # the draft is unsure here: this request's chain ends
                s.draft_token_ids.append(drafted[0])
                probs[s.request.request_id].append(drafted[1])
                if j + 1 < s.num_speculative_tokens:
                    drafting.append(s)
            if not drafting:
                break
            forward = self.runner.forward([ForwardItem(s.request.request_id, s.draft_token_ids[-1:],
                                                       s.request.num_tokens + j, 1) for s in drafting])
            rows = list(zip(drafting, forward.logits))
        for s, _ in live:
            p = probs[s.request.request_id]
            s.draft_probs = torch.stack(p) if p and p[0] is not None else None
            num_run = min(len(s.draft_token_ids), s.num_speculative_tokens - 1)  # the last drafted never runs
            self.progress.count_run(s.request.request_id, num_run)

    def start(self, s: ScheduledRequest) -> ForwardItem | None:
        """Roll ``s``'s draft state back and reserve its draft slots. Returns its catch-up
        ForwardItem, or None when it decodes plainly this step (an id the draft cannot embed, a
        full draft pool, no catch-up budget left)."""
        r = s.request
        s.draft_token_ids, s.draft_parents, s.draft_probs = [], None, None
        done, m = self.progress.begin(r, r.num_tokens)
        tokens = r.all_token_ids[done:]
        if ((tokens and max(tokens) >= self.num_embeddings)
                or not self.block_manager.allocate(r.request_id, r.num_tokens + self.scratch_positions(s))):
            self.progress.rollback(r)  # the grant comes back
            return None
        s.num_catch_up_tokens = m
        return ForwardItem(r.request_id, tokens[:m], done, int(done + m == r.num_tokens)) if m else None

    def scratch_positions(self, s: ScheduledRequest) -> int:
        """Draft slots past the committed tokens that ``s``'s proposal writes: k - 1 for a chain."""
        return s.num_speculative_tokens - 1

    def next_dist(self, s: ScheduledRequest, logits: torch.Tensor, paths: list[list[int]] | None = None
                  ) -> torch.Tensor:
        """What the next draft is picked from, per row of draft logits [M, V_draft]: a greedy
        request's logits over the draft's columns, else the processed distribution [M, V].
        ``paths``: the drafts before each row (None: the chain drafted so far), for ``mask_logits``."""
        if self.mask_logits is not None:
            logits = self.mask_logits(s, logits, paths)
        params = s.request.sampling_params
        if params.greedy:
            return logits if self.vocab_map is not None else logits[:, : self.target_vocab_size]
        return logits_to_probs(to_target_vocab(logits, self.target_vocab_size, self.vocab_map), params)

    def next_token(self, s: ScheduledRequest,
                   dist: torch.Tensor, j: int) -> tuple[int, torch.Tensor | None] | None:
        """Draft position ``j`` (0 = the first draft) of ``s`` from ``dist`` [V] (``next_dist``'s
        row): (token, the distribution it was drawn from, None for greedy), or None when the
        draft is unsure there (its top probability below the confidence threshold)."""
        greedy = s.request.sampling_params.greedy
        probs = torch.softmax(dist.float(), dim=-1) if greedy else dist
        top = float(probs.max())
        if top < self.confidence_threshold or not top > 0:
            return None
        if greedy:
            column = int(dist.argmax())
            return (column if self.vocab_map is None else int(self.vocab_map[column])), None
        return request_draws(s).sample(probs, j, DRAFT_DRAW), probs

    def observe(self, scheduled, outputs, hidden) -> None:
        """Roll the draft's K/V back to what the target kept this step (``DraftProgress.truncate``)."""
        self.progress.truncate(scheduled, outputs)

    def free(self, request_ids) -> None:
        self.progress.free(request_ids)
        for rid in request_ids:
            self.block_manager.free(rid)
