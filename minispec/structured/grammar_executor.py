"""Structured output in a step: forced tokens drafted free, drafts cut at the grammar, the target masked.

``GrammarModelExecutor`` subclasses ``TreeModelExecutor`` (so chains and trees both run) and
changes two of the core loop's steps for each request with a ``StructuredOutput``; its grammar
state is the ``StructuredOutputManager``'s (minispec/structured/grammar.py):
1. propose: where the grammar allows exactly one token (a key, a brace, a separator), the tokens it forces
   become the request's drafts, and the drafter is not asked (no draft forward: SGLang's jump-forward, Zheng
   et al. 2024, sec. 3.3), counted in ``num_forced_draft_tokens``. A drafter that drafts under the grammar's
   masks is replaced so only where the grammar forces all k drafts: it proposes forced tokens itself and
   drafts on past them (replacing it at every forced run cut the shipped head's tokens per verify step on the
   JSON route from 2.36 to 2.22; this rule gives 2.39: bench/results/json_routes*.json). The other requests'
   drafts come from the drafter (a draft model or EAGLE head drafts under the grammar's masks when
   ``SpecConfig.mask_draft``: :class:`DraftMask` below) and are cut before the verify at the first token
   the grammar rejects (a tree loses the nodes under it); a chain that passes whole is extended with the
   tokens the grammar forces after it. One exception keeps the law exact: a sampled draft drawn from a
   distribution keeps its first rejected token, which the verify then rejects, drawing the target's token
   from the residual (target - draft)+ as rejection sampling must (Leviathan et al. 2023, Alg. 1); drawing
   it from the target alone would skew the output towards the tokens the draft also favours. With the
   draft masked, no draft is ever rejected by the grammar, so this never happens.
2. verify: every row of the target's logits that samples is masked (-inf where the grammar
   forbids): row 0 by the grammar after the request's output, row 1 + i after the path to draft
   i. A row past a rejected draft, or where the grammar allows nothing (its end: the stop checks
   end the request before that row's token), decides no kept token and stays as it is. Masking
   comes before temperature, top-k and top-p, so a greedy verify keeps the masked argmax and
   rejection sampling keeps the masked target's law: greedy constrained speculation emits what
   greedy constrained decoding emits, token for token.
Invariant: every token emitted for a structured request, the bonus token included, is one its
grammar allows there. Read after the core (docs/architecture.md, "Structured output").
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.structured.grammar import StructuredOutputManager
from minispec.core.model_runner import ModelRunner
from minispec.speculation.tree_executor import TreeModelExecutor
from minispec.base.tree_shape import is_chain


class DraftMask:
    """A draft model's or head's rows of logits [M, V_draft] masked to what the grammar allows
    after the request's output and each row's path of drafts, before temperature, top-k and top-p,
    as the target's rows are (``DraftModelDrafter.mask_logits``: a chain or a tree alike). A row
    where the draft can propose none of the allowed tokens stays unmasked: its draft is cut before
    the verify. ``vocab_map``: the draft's column -> target id map (None: the same vocabulary)."""

    def __init__(self, grammars: StructuredOutputManager, vocab_map: torch.Tensor | None = None):
        self.grammars, self.vocab_map = grammars, vocab_map

    def __call__(self, s: ScheduledRequest, logits: torch.Tensor, paths: list[list[int]] | None = None
                 ) -> torch.Tensor:
        if not self.grammars.constrains(s.request):
            return logits
        allowed = self.grammars.masks(s.request, paths or [s.draft_token_ids] * len(logits)).to(logits.device)
        columns = allowed[:, self.vocab_map] if self.vocab_map is not None else allowed[:, : logits.shape[1]]
        if columns.shape[1] < logits.shape[1]:  # draft columns past the target's vocabulary: never allowed
            columns = torch.nn.functional.pad(columns, (0, logits.shape[1] - columns.shape[1]), value=False)
        proposable = columns & (logits > float("-inf"))
        return logits.masked_fill(~columns & proposable.any(-1, keepdim=True), float("-inf"))

class GrammarModelExecutor(TreeModelExecutor):
    """A TreeModelExecutor that constrains requests with structured output (see the module doc).

    Args: as ModelExecutor; grammars: the engine's StructuredOutputManager; jump_forward: draft
        the tokens a grammar forces without the drafter (``SpecConfig.jump_forward``);
        drafter_masks: the drafter drafts under the grammar's masks (a draft model or head with
        ``SpecConfig.mask_draft``): it proposes forced tokens itself and drafts on past them, so
        jump-forward replaces it only where the grammar forces a whole draft (k tokens).
    """

    def __init__(self, runner: ModelRunner, drafter=None, grammars: StructuredOutputManager | None = None,
                 jump_forward: bool = True, drafter_masks: bool = False,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__(runner, drafter, clock)
        self.grammars = grammars or StructuredOutputManager(None, self.vocab_size)
        self.jump_forward = jump_forward
        self.drafter_masks = drafter_masks

    def _propose(self, speculating: list[ScheduledRequest]) -> None:
        """Forced tokens as free drafts; the drafter for the rest; then the cut at the grammar."""
        grammars, drafting = self.grammars, []
        for s in speculating:
            forced = []
            if self.jump_forward and grammars.constrains(s.request):
                forced = grammars.forced(s.request, [], s.num_speculative_tokens)
                if self.drafter_masks and len(forced) < s.num_speculative_tokens:
                    # a masked drafter proposes the forced tokens itself, then drafts on past them
                    forced = []
            s.draft_token_ids, s.draft_parents, s.draft_probs = forced, None, None
            s.num_forced_draft_tokens = len(forced)
            if not forced:
                drafting.append(s)
        super()._propose(drafting)
        for s in drafting:
            if not grammars.constrains(s.request):
                continue
            if s.draft_parents is None:
                self._cut_chain(s)
            else:
                self._cut_tree(s)

    def _keeps_rejected(self, s: ScheduledRequest) -> bool:
        """A sampled request's drafts drawn from a distribution keep their first rejected token
        (the module doc: the verify's residual keeps the law)."""
        return not s.request.sampling_params.greedy and s.draft_probs is not None

    def _cut_chain(self, s: ScheduledRequest) -> None:
        """Drafts end at the first the grammar rejects; a chain that passes whole gets the tokens
        the grammar forces after it (each a draft proposed with probability 1)."""
        drafts = s.draft_token_ids
        valid = self.grammars.num_valid(s.request, [], drafts)
        n = min(len(drafts), valid + self._keeps_rejected(s))
        s.draft_token_ids = drafts[:n]
        if s.draft_probs is not None:
            s.draft_probs = s.draft_probs[:n] if n else None
        if valid < len(drafts) or not self.jump_forward:
            return
        room = min(s.num_speculative_tokens, s.num_draft_tokens) - n
        forced = self.grammars.forced(s.request, s.draft_token_ids, room) if room > 0 else []
        if forced:
            s.draft_token_ids = s.draft_token_ids + forced
            s.num_forced_draft_tokens = len(forced)
            if s.draft_probs is not None:
                one_hot = s.draft_probs.new_zeros((len(forced), s.draft_probs.shape[-1]))
                one_hot[torch.arange(len(forced)), torch.tensor(forced)] = 1.0
                s.draft_probs = torch.cat([s.draft_probs, one_hot])

    def _cut_tree(self, s: ScheduledRequest) -> None:
        """A tree keeps the nodes whose path the grammar allows (and, when ``_keeps_rejected``,
        the first rejected node of a path, never what hangs under it)."""
        paths: dict[int, list[int]] = {-1: []}  # node -> its path, for the nodes the grammar allows
        keep = []
        for i, (token, parent) in enumerate(zip(s.draft_token_ids, s.draft_parents)):
            if parent not in paths:
                continue  # under a rejected node: its verify can never reach this one
            if self.grammars.num_valid(s.request, paths[parent], [token]):
                paths[i] = paths[parent] + [token]
                keep.append(i)
            elif self._keeps_rejected(s):
                keep.append(i)
        index = {old: new for new, old in enumerate(keep)}
        parents = [-1 if s.draft_parents[i] < 0 else index[s.draft_parents[i]] for i in keep]
        s.draft_token_ids = [s.draft_token_ids[i] for i in keep]
        s.draft_parents = None if is_chain(parents) else parents
        if s.draft_probs is not None:
            s.draft_probs = s.draft_probs[keep] if keep else None

    def _emit(self, s: ScheduledRequest, logits: torch.Tensor) -> EmittedTokens:
        """As ModelExecutor._emit, on logits masked by the grammar at every row (module doc)."""
        if s.samples and self.grammars.constrains(s.request):
            logits = logits.masked_fill(~self.verify_masks(s).to(logits.device), float("-inf"))
        return super()._emit(s, logits)

    def verify_masks(self, s: ScheduledRequest) -> torch.Tensor:
        """[1 + len(drafts), V] bool: the ids the grammar allows at each row the target samples
        (row 0 after the output, row 1 + i after the path to draft i); all True for a row past a
        rejected draft or where the grammar allows nothing (the stop checks end the request first).
        Raises: ValueError when the grammar allows no id of the vocabulary after the output."""
        r, grammars = s.request, self.grammars
        first = grammars.allowed(r, []).mask
        if not first.any():
            raise ValueError(f"request {r.request_id}: its grammar allows no token of the model's "
                             "vocabulary here")
        drafts = s.draft_token_ids
        parents = s.draft_parents if s.draft_parents is not None else list(range(-1, len(drafts) - 1))
        paths: dict[int, list[int]] = {-1: []}
        rows = [first]
        for i, (token, parent) in enumerate(zip(drafts, parents)):
            row = None
            if parent in paths and grammars.num_valid(r, paths[parent], [token]):
                paths[i] = paths[parent] + [token]
                row = grammars.allowed(r, paths[i]).mask
            rows.append(row if row is not None and row.any() else torch.ones_like(first))
        return torch.stack(rows)

    def free(self, request_ids: list[str]) -> None:
        """As ModelExecutor.free; the requests' grammar state goes too (rebuilt from the kept tokens)."""
        super().free(request_ids)
        self.grammars.free(request_ids)
