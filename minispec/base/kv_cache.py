"""The paged K/V tensors.

``KVCache`` keeps per layer ``[num_blocks, block_size, Hkv, D]`` for K and for V: the third home of
state (beside ``Request`` and ``BlockManager``), written only by a ModelRunner's forward, by slot
(Kwon et al. 2023, PagedAttention). Which request owns which block is the BlockManager's business
(minispec/core/block_manager.py), and how many blocks the pool holds is minispec/build/pool.py's; this
file holds the values. Invariant: a block is zeroed before its first use, so a masked key never
brings NaN into attention's arithmetic.
Taught in notebooks/00_quickstart.ipynb and notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import torch


class KVCache:
    """The K/V tensors: per layer ``[num_blocks, block_size, Hkv, D]`` for K and for V.

    The tensors are allocated empty and a block is zeroed just before its first use (``ready``):
    on a CPU the operating system backs an allocation with memory only where it is written, so a
    pool of any size holds memory for the blocks the BlockManager has handed out, lowest first
    (notebooks build engines with the default pool and use a few MB of it; cached prefixes keep
    theirs, so with prefix caching it grows with the distinct prefixes seen). On a GPU the whole
    pool is allocated up front, as serving engines do. Zeroing matters: a masked key still
    enters attention's arithmetic (with weight 0), and never-written memory may hold NaN.

    Args:
        num_layers, num_blocks, block_size, num_kv_heads, head_dim: tensor shape.
        dtype, device: storage dtype and device.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.num_blocks_ready = 0  # blocks 0..num_blocks_ready-1 are zeroed or written

    def ready(self, num_blocks: int) -> None:
        """Zero blocks ``num_blocks_ready..num_blocks-1`` before their first use (see the class doc)."""
        if num_blocks > self.num_blocks_ready:
            self.k[:, self.num_blocks_ready:num_blocks].zero_()
            self.v[:, self.num_blocks_ready:num_blocks].zero_()
            self.num_blocks_ready = num_blocks
