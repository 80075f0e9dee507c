"""The feature channel a drafter declares: the target's features, kept by slot beside its K/V.

An EAGLE head drafts from the target's own hidden states (Li et al. 2024), so it declares a
``FeatureChannel``: F numbers per position, and the target layers whose outputs they hold besides
the final state (EAGLE-3, Li et al. 2025). The builder then budgets F per token in the KV pool,
has the target's runner return those layers (``ModelRunner(capture_layers=...)``) and gives the
drafter a ``FeatureStore``: a tensor [num_blocks, block_size, F] indexed by the target's own
slots. The drafter writes into it, as it observes each step, the features of the tokens the
target kept, at the positions they hold. Because the store is keyed by the target's slots,
whatever holds for the target's K/V holds for the features: only committed positions count,
a tree's accepted path sits where its K/V were moved, and a prefix-cache hit brings the cached
positions' features with their K/V. Invariant: a position's features are written before any
proposal reads them; a block is zeroed before its first use, as K/V are (``KVCache.ready``).
Taught in notebooks/04_speculative_decoding.ipynb (the EAGLE head).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.core.block_manager import BlockManager


@dataclass(frozen=True)
class FeatureChannel:
    """What a drafter reads of the target per position: ``width`` numbers (F), the outputs of
    target ``layers`` (increasing ids; () for the final hidden state alone) then the final state."""

    width: int
    layers: tuple[int, ...] = ()


class FeatureStore:
    """The target's features by slot: [num_blocks, block_size, F] over the target's block pool.

    Args:
        block_manager: the target's BlockManager (its block tables name the slots).
        width: F; dtype, device: storage.
    """

    def __init__(self, block_manager: BlockManager, width: int,
                 dtype: torch.dtype, device: torch.device | str):
        self.block_manager = block_manager
        self.tensor = torch.empty((block_manager.num_blocks, block_manager.block_size, width), dtype=dtype,
                                  device=device)
        self.num_blocks_ready = 0  # blocks 0..num_blocks_ready-1 are zeroed or written

    def _slots(self, request_id: str, start: int, end: int) -> torch.Tensor:
        slots = self.block_manager.slots(request_id, list(range(start, end)))
        return torch.tensor(slots, dtype=torch.long, device=self.tensor.device)

    def write(self, request_id: str, start: int, features: torch.Tensor) -> None:
        """Keep ``features`` [T, F] as those of positions start..start+T-1 of a request."""
        touched = self.block_manager.num_blocks_touched
        if touched > self.num_blocks_ready:
            self.tensor[self.num_blocks_ready:touched].zero_()
            self.num_blocks_ready = touched
        flat = self.tensor.view(-1, self.tensor.shape[-1])
        flat.index_copy_(0, self._slots(request_id, start, start + features.shape[0]),
                         features.to(flat.dtype))

    def read(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """The kept features [end - start, F] of positions start..end-1 of a request."""
        return (self.tensor.view(-1, self.tensor.shape[-1])
                .index_select(0, self._slots(request_id, start, end)))
