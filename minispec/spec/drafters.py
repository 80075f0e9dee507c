"""Drafters propose up to k tokens for each speculating request of a step.

- ``NgramDrafter``: prompt lookup (Saxena 2023; vLLM's n-gram proposer): find the most recent
  earlier occurrence of the request's last n tokens (n from ngram_max down to ngram_min) in its
  prompt and output, and propose the tokens that followed it. Free to run; deterministic.
- ``DraftModelDrafter``: a small causal LM with its own paged KV cache and the target's tokenizer
  (Leviathan et al. 2023; Chen et al. 2023). It catches up on tokens it has not seen (the prompt,
  then each step's accepted tokens and bonus), then runs k single-token steps, all requests of the
  step packed together. Rejected positions are rolled back by shrinking its computed count, at
  the verify that rejected them (``observe``), so plain steps in between never revive them. A
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
from minispec.attention import TreeLayout
from minispec.model_runner import ForwardItem, ModelRunner
from minispec.request import Request
from minispec.sampling import logits_to_probs
from minispec.spec.acceptance import FixedAlpha, canonical_tree
from minispec.spec.tree import DraftTree
from minispec.spec.verify import is_chain, request_draws, verify_exact, verify_synthetic
from minispec.tree_shape import tree_scratch_positions


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
    accepted drafts, so the draft keeps only K/V the target kept (``keep``, after every target
    step), then catches up on the tokens it has not seen and drafts k - 1 more on top. The real
    draft-model drafter and the simulator's draft cost share this bookkeeping.
    Invariant: after every step, verify or plain, ``num_cached`` counts only draft K/V computed from
    committed tokens. The rollback point is the verify itself: a later plain step moves the
    target's count past the rejected drafts' positions, so trimming only at the next proposal
    (to ``num_computed_tokens``) would keep their K/V as valid and draft from a wrong context.
    """

    def __init__(self):
        self.num_cached: dict[str, int] = {}

    def keep(self, scheduled: list[ScheduledRequest], outputs: list[EmittedTokens]) -> None:
        """After a target step, before the scheduler applies it: each request's draft keeps K/V
        only up to the tokens the target keeps (its own tokens of the step and the accepted drafts;
        the rejected drafts' positions are dropped here, at the verify that rejected them)."""
        for s, out in zip(scheduled, outputs):
            rid = s.request.request_id
            if rid in self.num_cached:
                kept = s.request.num_computed_tokens + s.num_own_tokens + out.num_accepted
                self.num_cached[rid] = min(self.num_cached[rid], kept)

    def rollback(self, request: Request) -> int:
        """Drop draft K/V past what the target holds (a request whose step failed and ran again
        never reached ``keep``). Returns the tokens still valid in the draft."""
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
        continuations = self.matches(tokens, k, 1)
        return continuations[0] if continuations else []

    def matches(self, tokens: list[int], k: int, limit: int) -> list[list[int]]:
        """Up to k tokens after each of the ``limit`` latest earlier matches of the longest suffix
        n-gram that matches at all (latest first)."""
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            suffix = tokens[-n:]
            found = []
            for start in range(len(tokens) - n - 1, -1, -1):
                # compare the last token before building a slice: most starts fail this cheap
                # test, which keeps a step's lookup in microseconds even for long sequences
                if tokens[start + n - 1] == suffix[-1] and tokens[start: start + n] == suffix:
                    found.append(tokens[start + n: start + n + k])
                    if len(found) == limit:
                        break
            if found:
                return found
        return []

    def lookup_tree(self, tokens: list[int], depth: int, topk: int, num_nodes: int) -> tuple[list[int], list[int]]:
        """A draft tree from several matches: the continuations of the latest matches merged into
        a trie (shared prefixes become one path, a different next token a new branch), latest
        match first, at most ``topk`` children a node and ``num_nodes`` nodes. Returns (tokens,
        parents). With topk 1 it is the chain ``lookup`` proposes."""
        tokens_out: list[int] = []
        parents: list[int] = []
        children: dict[int, dict[int, int]] = {}
        for continuation in self.matches(tokens, depth, 4 * topk):
            node = -1
            for token in continuation:
                kids = children.setdefault(node, {})
                if token not in kids:
                    if len(kids) >= topk or len(tokens_out) >= num_nodes:
                        break
                    kids[token] = len(tokens_out)
                    tokens_out.append(token)
                    parents.append(node)
                node = kids[token]
        return tokens_out, parents

    def propose(self, scheduled) -> None:
        for s in scheduled:
            if s.draft_depth is None:
                s.draft_token_ids, s.draft_parents = self.lookup(s.request.all_token_ids, s.num_speculative_tokens), None
            else:
                s.draft_token_ids, parents = self.lookup_tree(s.request.all_token_ids, s.draft_depth, s.draft_topk,
                                                              s.num_speculative_tokens)
                s.draft_parents = None if is_chain(parents) else parents
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
            s.draft_parents = None
            if s.draft_depth is not None:  # the tree shape the simulator prices
                s.draft_parents = canonical_tree(s.draft_depth, s.draft_topk, s.num_speculative_tokens)

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

    # -- proposing: a catch-up forward, then one forward per depth (a chain is a tree of topk 1) --
    def propose(self, scheduled) -> None:
        live = [(s, item, extra) for s in scheduled for item, extra in [self.start(s)] if item is not None]
        if not live:
            return
        trees = {id(s): self.new_tree(s) for s, _, _ in live}
        # forward 0: catch up on the tokens the draft has not seen; its last row drafts depth 1
        forward = self.run([item for _, item, _ in live], [extra for _, _, extra in live], first=True)
        frontier = {}
        for (s, _, _), logits, hidden in zip(live, forward.logits, forward.hidden):
            tree = trees[id(s)]
            tree.root_hidden = hidden[-1:]
            frontier[id(s)] = tree.grow({-1: self.next_dist(s, logits)[0]})
        for _ in range(1, max(s.max_draft_depth for s, _, _ in live)):
            active = [s for s, _, _ in live if frontier[id(s)]]
            if not active:
                break
            items, extras, rows = [], [], []
            for s in active:
                tree, nodes = trees[id(s)], frontier[id(s)]
                item, extra = self.node_item(s, tree, nodes)
                items.append(item)
                extras.append(extra)
                rows.append(nodes)
            forward = self.run(items, extras, first=False)
            for s, nodes, logits, hidden in zip(active, rows, forward.logits, forward.hidden):
                tree = trees[id(s)]
                dists = self.next_dist(s, logits)
                for j, node in enumerate(nodes):
                    tree.nodes[node].extra["hidden"] = hidden[j: j + 1]
                frontier[id(s)] = tree.grow({node: dists[j] for j, node in enumerate(nodes)})
        for s, _, _ in live:
            tokens, parents, probs, _ = trees[id(s)].finish()
            s.draft_token_ids = tokens
            s.draft_parents = None if is_chain(parents) else parents
            s.draft_probs = torch.stack(probs) if tokens and probs[0] is not None else None
            self.finish(s, trees[id(s)])

    def start(self, s: ScheduledRequest):
        """Get ``s`` ready to draft: roll its draft state back, reserve its draft slots, and
        return (its catch-up ForwardItem, the extra inputs that forward takes), or (None, None)
        when it decodes plainly this step (an id the draft cannot embed, a full draft pool)."""
        r, progress = s.request, self.progress
        start = progress.rollback(r)
        n = r.num_tokens
        s.draft_token_ids, s.draft_parents, s.draft_probs = [], None, None
        if not self.can_embed(r, start) or not self.block_manager.allocate(r.request_id, n + self.scratch(s)):
            return None, None
        progress.advance(r.request_id, n - start)
        return ForwardItem(r.request_id, r.all_token_ids[start:], start, 1), None

    @staticmethod
    def scratch(s: ScheduledRequest) -> int:
        """Draft slots past the committed tokens that proposing ``s`` may write: k - 1 for a chain
        (depth k's token is drafted but never run), topk per depth below the last for a tree
        (``tree_scratch_positions``; the scheduler's clamp keeps them within the draft's limit)."""
        return tree_scratch_positions(s.max_draft_depth, s.draft_topk)

    def new_tree(self, s: ScheduledRequest) -> DraftTree:
        params = s.request.sampling_params
        return DraftTree(s.max_draft_depth, s.draft_topk, s.num_speculative_tokens, params.greedy,
                         None if params.greedy else request_draws(s), self.confidence_threshold,
                         self.vocab_map if params.greedy else None)

    def scratch_base(self, s: ScheduledRequest) -> int:
        """The first draft slot past the committed tokens (the draft's K/V of position base - 1 is
        the last committed one: the request's last token)."""
        return s.request.num_tokens

    def node_item(self, s: ScheduledRequest, tree: DraftTree, nodes: list[int]):
        """The ForwardItem (and extra inputs) that runs ``nodes`` of ``tree``: each to the next
        free draft slot, rotated by its depth, attending to the committed tokens and its
        ancestors (a chain's single node is plain causal)."""
        base = self.scratch_base(s)
        used = sum(1 for n in tree.nodes if n.slot is not None)
        for j, node in enumerate(nodes):
            tree.nodes[node].slot = base + used + j
        start = base + used
        tokens = [tree.nodes[n].token for n in nodes]
        layout = None
        if tree.topk > 1:
            visible = []
            for n in nodes:
                seen, a = [], n
                while a >= 0:
                    seen.append(tree.nodes[a].slot)
                    a = tree.nodes[a].parent
                visible.append(sorted(seen))
            layout = TreeLayout(base, [base - 1 + tree.nodes[n].depth for n in nodes], visible)
        return ForwardItem(s.request.request_id, tokens, start, len(nodes), layout), None

    def run(self, items: list[ForwardItem], extras: list, first: bool):
        """One packed draft forward over ``items`` (a draft model needs no extra inputs)."""
        return self.runner.forward(items)

    def next_dist(self, s: ScheduledRequest, logits: torch.Tensor) -> torch.Tensor:
        """What a DraftTree grows from, per row of draft logits [M, V_draft]: for a greedy request
        the logits over the draft's own columns (the tree maps a reduced vocabulary's columns to
        target ids; columns past the target's vocabulary are cut: a greedy pick never needs the
        target-sized copy), the processed sampling distribution over target ids otherwise ([M, V])."""
        params = s.request.sampling_params
        if params.greedy:
            return logits if self.vocab_map is not None else logits[:, : self.target_vocab_size]
        return logits_to_probs(self.to_target_vocab(logits), params)

    def finish(self, s: ScheduledRequest, tree: DraftTree) -> None:
        """After proposing: the draft's K/V past the committed tokens is valid only where the
        accepted drafts will stand. A chain's drafts sit at their own positions (DraftProgress.keep
        trims the rejected ones at the verify); a tree's sit at scratch slots, so they are dropped
        now and the next catch-up runs the accepted path again."""
        rid = s.request.request_id
        if tree.topk == 1:
            self.progress.advance(rid, sum(1 for n in tree.nodes if n.slot is not None))

    def observe(self, scheduled, outputs, hidden) -> None:
        """Roll the draft's K/V back to what the target kept this step (``DraftProgress.keep``)."""
        self.progress.keep(scheduled, outputs)

    def free(self, request_ids) -> None:
        self.progress.free(request_ids)
        for rid in request_ids:
            self.block_manager.free(rid)
