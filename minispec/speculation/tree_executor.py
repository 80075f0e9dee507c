"""Verifying a draft tree in one target forward: tree attention, then the accepted path moved into place.

A request the drafter gave a tree (``ScheduledRequest.draft_parents``) feeds the target its own
tokens and its N nodes as one run of N + 1 rows: the nodes go to the next N slots in row order,
each attends to the committed context, its ancestors and itself, and is rotated by its depth
(``tree_shape.TreeLayout``; SpecInfer, Miao et al. 2024, sec. 4.2). After the verify
(speculation/tree_verify.py) the accepted path's K/V are moved from its nodes' slots to the positions
the path now holds (``move_kv``), so rejected branches leave nothing the cache
counts, and the drafter sees the target's features of the own tokens and that path only.
``TreeModelExecutor`` subclasses the core ``ModelExecutor`` (minispec/core/executor.py); a chain goes
through it unchanged. Invariant: after the step, positions up to the request's last accepted
draft hold exactly the K/V a causal forward of the kept tokens writes.
Taught in notebooks/06_what_speculation_costs.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minispec.core.batch import EmittedTokens, ScheduledRequest
from minispec.core.executor import ModelExecutor
from minispec.core.model_runner import ForwardItem, ModelRunner
from minispec.base.tree_shape import TreeLayout


class TreeModelExecutor(ModelExecutor):
    """A ModelExecutor that also verifies draft trees (see the module doc). Args: as ModelExecutor."""

    def _item(self, s: ScheduledRequest) -> ForwardItem:
        """As ModelExecutor._item; a draft tree's nodes hang under the last own token."""
        item = super()._item(s)
        if s.draft_parents is None or not s.draft_token_ids:
            return item
        o = s.num_own_tokens
        parents = list(range(-1, o - 1)) + [o - 1 if p < 0 else o + p for p in s.draft_parents]
        return replace(item, tree=TreeLayout.from_parents(s.request.num_computed_tokens, parents))

    def _keep_path(self, s: ScheduledRequest, out: EmittedTokens, features: torch.Tensor) -> torch.Tensor:
        """For a draft tree: move its accepted path's K/V from the nodes' slots to the positions
        the path now holds, and return the target's features [T', F] of the request's own tokens
        and that path, in order. Any other request's features are returned as they are."""
        path = out.accepted_nodes
        if s.draft_parents is None or path is None:
            return features
        first = s.request.num_computed_tokens + s.num_own_tokens  # node i was written at first + i
        moved = [(first + n, first + j) for j, n in enumerate(path) if n != j]
        if moved:
            move_kv(self.runner, s.request.request_id, [a for a, _ in moved], [b for _, b in moved])
        rows = list(range(s.num_own_tokens)) + [s.num_own_tokens + n for n in path]
        return features[rows]


@torch.inference_mode()
def move_kv(runner: ModelRunner, request_id: str, src_positions: list[int], dst_positions: list[int]) -> None:
    """Copy the K/V of a request's cache positions ``src_positions`` to ``dst_positions`` in every
    layer of ``runner``'s cache (a tree's accepted path moves to the positions it now holds). Sources
    are all read before any destination is written (the lists may overlap; destinations distinct)."""
    bm = runner.block_manager
    src, dst = (torch.tensor(bm.slots(request_id, ps), dtype=torch.long, device=runner.device)
                for ps in (src_positions, dst_positions))
    for cache in (runner.kv_cache.k, runner.kv_cache.v):
        flat = cache.view(cache.shape[0], -1, *cache.shape[3:])  # [L, blocks * block_size, Hkv, D]
        flat.index_copy_(1, dst, flat.index_select(1, src))
