"""Execute a scheduled Batch on a real model: propose drafts, run one packed forward, sample/verify.

``ModelRunner`` packs token runs from many requests into one forward over a paged KV cache and
returns the logits rows asked for; the target and a draft model each have one. ``ModelExecutor``
is the engine's real executor (the simulator's has the same ``execute``/``free`` interface).
Invariant: each request's tokens are written to the cache slots of their positions, so a later
step that rewrites a position (after a rejected draft token) simply overwrites the stale K/V.
Taught in notebooks/00_quickstart.ipynb and notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from minispec.attention import AttentionMetadata, build_group
from minispec.kv_cache import BlockManager, KVCache
from minispec.models.llama import LlamaModel
from minispec.sampling import logits_to_probs, next_tokens
from minispec.scheduler import Batch, SeqOutput
from minispec.spec.verify import verify_greedy, verify_sampled


@dataclass
class ForwardItem:
    """A run of tokens for one request: ``token_ids`` start at position ``start_pos``; the last
    ``num_logits`` of them need logits (0 for a mid-prompt chunk)."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    num_logits: int
    features: torch.Tensor | None = None  # [T, E] extra inputs for a draft head that reads them (spec/eagle.py)


class ModelRunner:
    """A model, its KV tensors and its block pool: runs packed forwards for lists of ForwardItems."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, block_manager: BlockManager, device: torch.device):
        self.model = model
        self.kv_cache = kv_cache
        self.block_manager = block_manager
        self.device = device

    @torch.inference_mode()
    def forward(self, items: list[ForwardItem], return_hidden: bool = False):
        """One packed step. Blocks must already cover every position.

        Returns: per item, logits [num_logits, V] float32 (an empty tensor when num_logits is 0);
        with ``return_hidden``, also per item the model's last hidden states [T, E] (every token of
        the item, in the model's dtype): (logits list, hidden list).
        """
        bm, bs = self.block_manager, self.block_manager.block_size
        limit = self.model.cfg.max_position_embeddings
        if any(item.start_pos + len(item.token_ids) > limit for item in items):
            raise ValueError(f"a position reaches the model's limit of {limit} tokens")
        input_ids, positions, slots = [], [], []
        by_qlen: dict[int, list[tuple[list[int], list[int], str, int]]] = {}
        logit_rows, counts = [], []
        for item in items:
            table = bm.block_tables[item.request_id]
            start = len(input_ids)
            pos = list(range(item.start_pos, item.start_pos + len(item.token_ids)))
            input_ids += item.token_ids
            positions += pos
            slots += [table[p // bs] * bs + p % bs for p in pos]
            idx = list(range(start, len(input_ids)))
            by_qlen.setdefault(len(idx), []).append((idx, pos, item.request_id, pos[-1] + 1))
            logit_rows += idx[len(idx) - item.num_logits:] if item.num_logits else []
            counts.append(item.num_logits)
        groups = [
            build_group([g[0] for g in grp], [g[1] for g in grp], [bm.block_tables[g[2]] for g in grp],
                        [g[3] for g in grp], bs, self.device)
            for grp in by_qlen.values()
        ]
        dev = self.device
        meta = AttentionMetadata(torch.tensor(slots, dtype=torch.long, device=dev), groups)
        extra = {}
        if any(item.features is not None for item in items):
            extra["features"] = torch.cat([item.features for item in items]).to(dev)
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long, device=dev),
                            torch.tensor(positions, dtype=torch.long, device=dev),
                            self.kv_cache.k, self.kv_cache.v, meta, **extra)
        rows = hidden.index_select(0, torch.tensor(logit_rows, dtype=torch.long, device=dev))
        logits = list(self.model.compute_logits(rows).cpu().split(counts))
        if return_hidden:
            return logits, list(hidden.split([len(item.token_ids) for item in items]))
        return logits


@dataclass
class StepResult:
    """What an executor returns for a Batch: one SeqOutput per scheduled request, plus timing (s)."""

    outputs: list[SeqOutput]
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    extra: dict = field(default_factory=dict)


class ModelExecutor:
    """The real executor: drafter (if any), target forward, then sampling or verification.

    Args:
        runner: the target's ModelRunner.
        drafter: a :class:`minispec.spec.drafters.Drafter` or None.
        clock: seconds; ``time.perf_counter`` unless a test passes a fake one.
    """

    def __init__(self, runner: ModelRunner, drafter=None, clock: Callable[[], float] = time.perf_counter):
        self.runner = runner
        self.drafter = drafter
        self.clock = clock

    @property
    def vocab_size(self) -> int:
        return self.runner.model.cfg.vocab_size

    def execute(self, batch: Batch) -> StepResult:
        t0 = self.clock()
        speculating = [s for s in batch.scheduled if s.num_spec_tokens > 0]
        if speculating and self.drafter is not None:
            self.drafter.propose(speculating)
        t1 = self.clock()
        items = []
        for s in batch.scheduled:
            r = s.request
            own = r.all_token_ids[r.num_computed_tokens: r.num_computed_tokens + s.num_new_tokens]
            num_logits = (1 + len(s.draft_token_ids)) if s.completes_prefill else 0
            items.append(ForwardItem(r.request_id, own + s.draft_token_ids, r.num_computed_tokens, num_logits))
        if getattr(self.drafter, "reads_target_hidden", False):  # duck-typed drafters lack it
            logits, hidden = self.runner.forward(items, return_hidden=True)
        else:
            logits, hidden = self.runner.forward(items), None
        outputs = [self._tokens(s, row) for s, row in zip(batch.scheduled, logits)]
        if hidden is not None:  # an EAGLE head keeps the target features of the tokens kept
            self.drafter.observe(batch.scheduled, hidden, outputs)
        t2 = self.clock()
        return StepResult(outputs, draft_time_s=t1 - t0, target_time_s=t2 - t1)

    def _tokens(self, s, logits: torch.Tensor) -> SeqOutput:
        """Sample a plain step, or verify a speculative one (Leviathan et al. 2023, Alg. 1)."""
        if logits.shape[0] == 0:
            return SeqOutput([])
        r, params = s.request, s.request.sampling_params
        drafts = s.draft_token_ids
        if not drafts:
            return SeqOutput(next_tokens(logits, params, r.generator).tolist())
        if getattr(self.drafter, "synthetic", False):
            accepted = self.drafter.draw_num_accepted(len(drafts))
            r.synthetic = True
            last = next_tokens(logits[accepted: accepted + 1], params, r.generator).tolist()
            return SeqOutput(drafts[:accepted] + last, len(drafts), accepted)
        if params.greedy:
            emitted, accepted = verify_greedy(drafts, logits)
        else:
            emitted, accepted = verify_sampled(drafts, s.draft_probs, logits_to_probs(logits, params), r.generator)
        return SeqOutput(emitted, len(drafts), accepted)

    def free(self, request_ids: list[str]) -> None:
        """Drop per-request state held outside the scheduler (the drafter's KV)."""
        if self.drafter is not None:
            self.drafter.free(request_ids)

