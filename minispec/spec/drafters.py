"""Drafters propose up to k tokens for each speculating request of a step.

- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM's n-gram proposer): find the most recent
  earlier occurrence of the request's last n tokens (n from ngram_max down to ngram_min) in its
  prompt and output, and propose the tokens that followed it. Free to run; deterministic.
- ``DraftModelDrafter``: a small causal LM with its own paged KV cache and the target's tokenizer
  (Leviathan et al. 2023; Chen et al. 2023). It catches up on tokens it has not seen (the prompt,
  then each step's accepted tokens and bonus), then runs k single-token steps, all requests of the
  step packed together. Rejected positions are rolled back by shrinking its computed count.
- ``SyntheticDrafter``: acceptance pinned to alpha per position, for timing studies; the text it
  yields is not model output (requests are flagged ``synthetic``).
Invariant: a drafter never proposes more than a request's reserved k; proposing fewer (even 0)
just makes that request's verify shorter (0 = a plain decode).
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.kv_cache import BlockManager
from minispec.sampling import logits_to_probs, sample


class Drafter:
    """Interface: ``propose`` fills ``draft_token_ids`` (and ``draft_probs``) of ScheduledRequests."""

    synthetic = False
    reads_target_hidden = False  # True: the executor passes target hidden states to ``observe``

    def propose(self, scheduled: list) -> None:
        raise NotImplementedError

    def free(self, request_ids: list[str]) -> None:
        """Forget per-request state (finish, abort, preemption)."""


class NgramDrafter(Drafter):
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
            s.draft_token_ids = self.lookup(s.request.all_token_ids, s.num_spec_tokens)
            s.draft_probs = None


class SyntheticDrafter(Drafter):
    """Each proposed position is accepted with probability alpha, whatever its content."""

    synthetic = True

    def __init__(self, alpha: float, seed: int = 0):
        self.alpha = alpha
        self.generator = torch.Generator().manual_seed(seed)

    def propose(self, scheduled) -> None:
        for s in scheduled:
            s.draft_token_ids = [s.request.all_token_ids[-1]] * s.num_spec_tokens
            s.draft_probs = None

    def draw_num_accepted(self, k: int) -> int:
        """Accepted prefix length: Bernoulli(alpha) per position until the first failure."""
        draws = torch.rand(k, generator=self.generator) < self.alpha
        return int(draws.long().cumprod(0).sum())


class DraftModelDrafter(Drafter):
    """A draft LM with its own KV cache, driven with the same packed runner as the target.

    Args:
        runner: a :class:`minispec.executor.ModelRunner` for the draft (own KV and block pool).
        target_vocab_size: V of the target; draft logits are cut or padded (with zero
            probability) to it, so a vocabulary padded to another size still verifies exactly.
        vocab_map: optional [V_draft] long tensor of target token ids, for a draft whose LM head
            covers only a subset of the target's vocabulary (FR-Spec, Zhao et al. 2025); tokens
            outside it get zero draft probability, which keeps verification exact.
    """

    def __init__(self, runner, target_vocab_size: int, vocab_map: torch.Tensor | None = None):
        self.runner = runner
        self.target_vocab_size = target_vocab_size
        self.vocab_map = vocab_map
        self.num_computed: dict[str, int] = {}
        self.max_model_len = runner.model.cfg.max_position_embeddings

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
        from minispec.executor import ForwardItem

        bm = self.block_manager
        live = []
        for s in scheduled:
            r = s.request
            # keep only the draft K/V whose tokens the target kept (rollback of rejected drafts)
            done = min(self.num_computed.get(r.request_id, 0), r.num_computed_tokens)
            if not bm.allocate(r.request_id, r.num_tokens + s.num_spec_tokens - 1):
                s.draft_token_ids, s.draft_probs = [], None  # draft pool full: decode plainly
                continue
            self.num_computed[r.request_id] = done
            s.draft_token_ids, s.draft_probs = [], []
            live.append(s)
        pending = {s.request.request_id: s.request.all_token_ids[self.num_computed[s.request.request_id]:]
                   for s in live}
        for step in range(max((s.num_spec_tokens for s in live), default=0)):
            active = [s for s in live if len(s.draft_token_ids) < s.num_spec_tokens]
            items = []
            for s in active:
                rid = s.request.request_id
                tokens = pending[rid] if step == 0 else s.draft_token_ids[-1:]
                items.append(ForwardItem(rid, tokens, self.num_computed[rid], 1))
                self.num_computed[rid] += len(tokens)
            for s, logits in zip(active, self.runner.forward(items)):
                self.append_draft(s, logits)
        for s in live:
            s.draft_probs = torch.stack(s.draft_probs) if s.draft_probs else None

    def append_draft(self, s, logits: torch.Tensor) -> None:
        """Draw the next draft token of ScheduledRequest ``s`` from draft logits [1, V_draft]:
        argmax for a greedy request, else a sample under its sampling params, whose probabilities
        [V_target] are kept for rejection sampling."""
        logits = self.to_target_vocab(logits)
        params = s.request.sampling_params
        if params.greedy:
            s.draft_token_ids.append(int(logits[0].argmax()))
        else:
            probs = logits_to_probs(logits, params)
            s.draft_token_ids.append(int(sample(probs, s.request.generator)))
            s.draft_probs.append(probs[0])

    def free(self, request_ids) -> None:
        for rid in request_ids:
            self.num_computed.pop(rid, None)
            self.block_manager.free(rid)
