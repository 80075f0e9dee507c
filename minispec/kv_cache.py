"""The paged KV cache: a pool of fixed-size blocks and one block table per request.

Kwon et al. 2023 (PagedAttention, section 4): K/V live in blocks of ``block_size`` tokens; a
request's block table maps its logical block i to a physical block, so memory grows one block at a
time and comes back whole when the request ends. Invariants kept here: a block is either free or
in exactly one table, and every block is free again once no request holds it. The lowest free
block goes first, so the blocks ever used are 0..n-1 with n the most ever held at once: on a CPU
the pool's tensors take memory only for those (``KVCache.ready``), whatever the pool's size.
Taught in notebooks/00_quickstart.ipynb and notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import heapq

import torch


class BlockManager:
    """Free list plus block tables. Pure bookkeeping: no tensors, so the simulator shares it.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
    """

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))  # a min-heap: the lowest free block goes first
        self.block_tables: dict[str, list[int]] = {}
        self.num_blocks_touched = 0  # blocks 0..num_blocks_touched-1 have been handed out

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow the table of ``request_id`` to cover ``num_tokens`` tokens.

        Returns False (and changes nothing) when the pool has too few free blocks.
        """
        table = self.block_tables.setdefault(request_id, [])
        extra = self.blocks_needed(num_tokens) - len(table)
        if extra > len(self._free):
            if not table:
                del self.block_tables[request_id]
            return False
        for _ in range(max(extra, 0)):
            block = heapq.heappop(self._free)
            self.num_blocks_touched = max(self.num_blocks_touched, block + 1)
            table.append(block)
        return True

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Return the blocks past the first ``num_tokens`` tokens (after rejected draft tokens)."""
        table = self.block_tables.get(request_id)
        if table is None:
            return
        keep = self.blocks_needed(num_tokens)
        while len(table) > keep:
            heapq.heappush(self._free, table.pop())

    def free(self, request_id: str) -> None:
        """Return every block of ``request_id`` to the pool (finish, abort, preemption)."""
        for block in self.block_tables.pop(request_id, ()):
            heapq.heappush(self._free, block)

    def slot(self, request_id: str, position: int) -> int:
        """Flat slot index (block * block_size + offset) of token ``position`` of a request."""
        table = self.block_tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def check_invariants(self) -> None:
        """Raise AssertionError if a block is lost, duplicated, or both free and in use."""
        used = [b for table in self.block_tables.values() for b in table]
        assert len(used) == len(set(used)), "a block sits in two block tables"
        assert not set(used) & set(self._free), "a block is both free and in a table"
        assert len(used) + len(self._free) == self.num_blocks, "a block was lost"


class KVCache:
    """The K/V tensors: per layer ``[num_blocks, block_size, Hkv, D]`` for K and for V.

    The tensors are allocated empty and a block is zeroed just before its first use (``ready``):
    on a CPU the operating system backs an allocation with memory only where it is written, so a
    pool of any size holds memory for the blocks the BlockManager has handed out, lowest first
    (notebooks build engines with the default pool and use a few MB of it). On a GPU the whole
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

    @property
    def num_bytes_ready(self) -> int:
        """Bytes of the blocks in use so far, K and V (what the pool holds in memory on a CPU)."""
        per_block = self.k[:, :1].numel() * self.k.element_size() * 2
        return per_block * self.num_blocks_ready


def kv_pool_blocks(num_kv_blocks: int | None, kv_cache_bytes: float, kv_bytes_per_token: float,
                   block_size: int, max_model_len: int) -> int:
    """Blocks in the KV pool: ``num_kv_blocks`` when given, else as many as ``kv_cache_bytes`` holds.

    One formula for the real engine (its configured budget) and the simulator (device memory left
    after the weights). ``kv_bytes_per_token`` is what one token costs in every pool that grows
    with the target's (the target's K/V, plus a draft model's when it keeps its own cache), so the
    budget covers them all.

    Raises: ValueError when the pool cannot hold one request of ``max_model_len`` tokens.
    """
    if num_kv_blocks is not None:
        num = num_kv_blocks
    else:
        num = int(kv_cache_bytes // (kv_bytes_per_token * block_size))
    need = -(-max_model_len // block_size)
    if num < need:
        raise ValueError(
            f"KV pool of {num} blocks x {block_size} tokens cannot hold one request of "
            f"max_model_len={max_model_len} tokens (needs {need} blocks): raise num_kv_blocks or "
            f"kv_cache_bytes, or lower max_model_len")
    return num
