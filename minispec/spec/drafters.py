"""Drafters propose up to k tokens for each speculating request of a step.

- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM's n-gram proposer): find the most recent
  earlier occurrence of the request's last n tokens (n from ngram_max down to ngram_min) in its
  prompt and output, and propose the tokens that followed it. Free to run; deterministic.
- ``DraftModelDrafter``: a small causal LM with its own paged KV cache and the target's tokenizer
  (Leviathan et al. 2023; Chen et al. 2023). It catches up on tokens it has not seen (the prompt,
  then each step's accepted tokens and bonus), then runs k single-token steps, all requests of the
  step packed together. Rejected positions are rolled back by shrinking its computed count. A
  request whose tokens hold an id the draft cannot embed (its vocabulary is smaller than the
  target's) decodes without drafts from then on: the target's tokens are emitted as ever.
- ``SyntheticDrafter``: acceptance drawn from an acceptance model (alpha per position), for timing
  studies; the text it yields is not model output (requests are flagged ``synthetic``).
All implement the executor's ``Drafter`` protocol (minispec/executor.py): propose, verify,
observe, free. Invariant: a drafter never proposes more than a request's reserved k; proposing
fewer (even 0) just makes that request's verify shorter (0 = a plain decode).
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.batch import EmittedTokens, ScheduledRequest
from minispec.kv_cache import BlockManager
from minispec.model_runner import ForwardItem, ModelRunner
from minispec.request import Request
from minispec.sampling import DRAFT_DRAW, logits_to_probs
from minispec.spec.acceptance import FixedAlpha
from minispec.spec.verify import request_draws, verify_exact, verify_synthetic


class BaseDrafter:
    """The protocol's defaults: exact verification (the output keeps the target's law), nothing to
    observe, no per-request state. Subclasses implement ``propose``."""

    def propose(self, scheduled: list[ScheduledRequest]) -> None:
        raise NotImplementedError

    def verify(self, scheduled: ScheduledRequest, target_logits: torch.Tensor) -> EmittedTokens:
        return verify_exact(scheduled, target_logits)

    def observe(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens],
                hidden: list[torch.Tensor]) -> None:
        """Nothing to keep: only a drafter that reads the target's hidden states needs this."""

    def free(self, request_ids: list[str]) -> None:
        """Forget per-request state (finish, abort, preemption)."""


class DraftProgress:
    """How many tokens of each request a draft model's KV cache holds: its catch-up and rollback.

    The draft has seen the tokens up to ``num_cached``; after a verify the target keeps only the
    accepted drafts, so the draft keeps only K/V the target kept (``rollback``), then catches up
    on the tokens it has not seen and drafts k - 1 more on top. The real draft-model drafter and
    the simulator's draft cost share this bookkeeping.
    """

    def __init__(self):
        self.num_cached: dict[str, int] = {}

    def rollback(self, request: Request) -> int:
        """Drop draft K/V past what the target kept. Returns the tokens still valid in the draft."""
        done = min(self.num_cached.get(request.request_id, 0), request.num_computed_tokens)
        self.num_cached[request.request_id] = done
        return done

    def pending(self, request: Request) -> int:
        """Tokens the draft must catch up on before it can draft (after ``rollback``)."""
        return request.num_tokens - self.num_cached[request.request_id]

    def advance(self, request_id: str, num_tokens: int) -> None:
        """The draft ran ``num_tokens`` more tokens of this request."""
        self.num_cached[request_id] += num_tokens

    def free(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.num_cached.pop(rid, None)


class NgramDrafter(BaseDrafter):
    """Prompt lookup: match the last n tokens earlier in the sequence, copy what followed."""

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens following the latest earlier match of the longest suffix n-gram."""
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                # compare the last token before building a slice: most starts fail this cheap
                # test, which keeps a step's lookup in microseconds even for long sequences
                if tokens[start + n - 1] == suffix[-1] and tokens[start: start + n] == suffix:
                    return tokens[start + n: start + n + k]
        return []

    def propose(self, scheduled) -> None:
        for s in scheduled:
            s.draft_token_ids = self.lookup(s.request.all_token_ids, s.num_speculative_tokens)
            s.draft_probs = None


class SyntheticDrafter(BaseDrafter):
    """Proposes k copies of the last token; the verify accepts a prefix drawn from ``acceptance``
    (default: each position with probability alpha), whatever the drafts say.

    Args:
        alpha: per-position acceptance probability, used when ``acceptance`` is None.
        seed: seeds the default acceptance model.
        acceptance: an acceptance model (spec/acceptance.py), shared in kind with the simulator.
    """

    def __init__(self, alpha: float = 0.6, seed: int = 0, acceptance=None):
        self.acceptance = acceptance if acceptance is not None else FixedAlpha(alpha, seed)

    def propose(self, scheduled) -> None:
        for s in scheduled:
            s.draft_token_ids = [s.request.all_token_ids[-1]] * s.num_speculative_tokens
            s.draft_probs = None

    def verify(self, scheduled, target_logits):
        return verify_synthetic(scheduled, target_logits, self.acceptance)


class DraftModelDrafter(BaseDrafter):
    """A draft LM with its own KV cache, driven with the same packed runner as the target.

    Its pool does not cache prefixes: when the target found a request's prompt in its prefix
    cache, the draft still catches up from position 0 at the request's first proposal (its
    progress starts at 0 whatever the target computed), so its K/V never depend on another
    request's. That costs one draft forward over the prompt, a small share of a target prefill
    for a draft chosen to be cheap, and keeps the simulator's draft cost (``DraftProgress``) exact.

    Args:
        runner: a :class:`~minispec.model_runner.ModelRunner` for the draft (own KV and block pool).
        target_vocab_size: V of the target; draft logits are cut or padded (with zero
            probability) to it, so a vocabulary padded to another size still verifies exactly.
        vocab_map: optional [V_draft] long tensor of target token ids, for a draft whose LM head
            covers only a subset of the target's vocabulary (FR-Spec, Zhao et al. 2025); tokens
            outside it get zero draft probability, which keeps verification exact.
        confidence_threshold: in [0, 1): a position is drafted only while the draft's highest
            probability there is at least this value; that request's drafting stops at the first
            position below it (``SpecConfig.draft_confidence_threshold``). 0 proposes all k.
    """

    def __init__(self, runner: ModelRunner, target_vocab_size: int, vocab_map: torch.Tensor | None = None,
                 confidence_threshold: float = 0.0):
        self.runner = runner
        self.confidence_threshold = confidence_threshold
        self.target_vocab_size = target_vocab_size
        self.vocab_map = vocab_map
        self.progress = DraftProgress()
        self.max_model_len = runner.model.cfg.max_position_embeddings
        # ids the draft can embed: its embedding rows (a vocabulary-subset draft keeps all of the
        # target's rows; a smaller model may have fewer than the target emits)
        self.num_embeddings = runner.model.embed_tokens.shape[0]

    def can_embed(self, request: Request, start: int) -> bool:
        """True when the draft can embed every token of ``request`` from position ``start`` on.
        The tokens before ``start`` were checked when the draft ran them."""
        tokens = request.all_token_ids[start:]
        return not tokens or max(tokens) < self.num_embeddings

    @property
    def block_manager(self) -> BlockManager:
        return self.runner.block_manager

    def to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [M, V_draft] -> [M, V_target], -inf where the draft has no token."""
        v = self.target_vocab_size
        if self.vocab_map is not None:
            full = logits.new_full((logits.shape[0], v), float("-inf"))
            full[:, self.vocab_map] = logits
            return full
        if logits.shape[1] >= v:
            return logits[:, :v]
        pad = logits.new_full((logits.shape[0], v - logits.shape[1]), float("-inf"))
        return torch.cat([logits, pad], dim=1)

    def propose(self, scheduled) -> None:
        bm, progress = self.block_manager, self.progress
        live = []
        for s in scheduled:
            r = s.request
            start = progress.rollback(r)
            # an id the draft cannot embed, or a full draft pool: this request decodes plainly
            room = self.can_embed(r, start) and bm.allocate(r.request_id, r.num_tokens + s.num_speculative_tokens - 1)
            if not room:
                s.draft_token_ids, s.draft_probs = [], None
                continue
            s.draft_token_ids, s.draft_probs = [], []
            live.append(s)
        for step in range(max((s.num_speculative_tokens for s in live), default=0)):
            # still drafting: fewer than k so far, and no token fell below the confidence threshold
            active = [s for s in live if len(s.draft_token_ids) == step < s.num_speculative_tokens]
            if not active:
                break
            items = []
            for s in active:
                r, rid = s.request, s.request.request_id
                start = progress.num_cached[rid]
                # step 0 catches up on every token the draft has not seen; then one draft at a time
                tokens = r.all_token_ids[start:] if step == 0 else s.draft_token_ids[-1:]
                items.append(ForwardItem(rid, tokens, start, 1))
                progress.advance(rid, len(tokens))
            for s, logits in zip(active, self.runner.forward(items).logits):
                self.append_draft(s, logits)
        for s in live:
            s.draft_probs = torch.stack(s.draft_probs) if s.draft_probs else None

    def append_draft(self, s, logits: torch.Tensor) -> bool:
        """Draw the next draft token of ScheduledRequest ``s`` from draft logits [1, V_draft]:
        argmax for a greedy request, else a sample under its sampling params (the request's draft
        draw keyed by that token's output position), whose probabilities [V_target] are kept for
        rejection sampling.

        Returns: False, proposing nothing, when the draft is unsure: its highest probability at
        this position is below ``confidence_threshold`` (for a greedy request under the softmax of
        its draft logits at temperature 1, for a sampled one under its own sampling params). The
        test reads the draft distribution before any token is drawn, never the drawn token's own
        probability: rejection sampling is exact only for a token drawn from the whole draft
        distribution, and keeping only the likely draws would skew the output (tested).
        """
        logits = self.to_target_vocab(logits)
        params = s.request.sampling_params
        threshold = self.confidence_threshold
        if params.greedy:
            if threshold > 0 and float(torch.softmax(logits[0], dim=-1).max()) < threshold:
                return False
            s.draft_token_ids.append(int(logits[0].argmax()))
            return True
        probs = logits_to_probs(logits, params)
        if threshold > 0 and float(probs[0].max()) < threshold:
            return False
        s.draft_token_ids.append(request_draws(s).sample(probs[0], len(s.draft_token_ids), DRAFT_DRAW))
        s.draft_probs.append(probs[0])
        return True

    def free(self, request_ids) -> None:
        self.progress.free(request_ids)
        for rid in request_ids:
            self.block_manager.free(rid)
