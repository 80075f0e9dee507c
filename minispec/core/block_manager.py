"""Block allocation for the paged KV cache: a pool of fixed-size blocks, one block table per request.

Kwon et al. 2023 (PagedAttention, sec. 4): a request's block table maps its logical block i to a
physical block of ``block_size`` tokens, so memory grows a block at a time and comes back whole
when the request ends. The lowest free block goes first (on a CPU the pool then takes memory only
for the blocks ever used: ``KVCache.ready``). Invariant: every block is held (reference count =
the tables it sits in) or free, never both. Bookkeeping only, no tensors: the simulator shares it.
Extended by the prefix cache (minispec/kv/prefix_cache.py). Taught in
notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import heapq
from collections import Counter


class BlockManager:
    """Free list and block tables.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
    Raises: ValueError for num_blocks or block_size below 1.
    """

    enable_prefix_caching = False  # PrefixCachingBlockManager (prefix_cache.py) finds cached blocks

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks))  # a min-heap: the lowest free block goes first
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[str, list[int]] = {}
        self.num_blocks_touched = 0  # blocks 0..num_blocks_touched-1 have been handed out

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (shared ones count once)."""
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, request_id: str, num_tokens: int, cached: list[int] = ()) -> bool:
        """Grow the table of ``request_id`` to cover ``num_tokens`` tokens; ``cached``: shared blocks
        a new table starts with (``cached_prefix``: none here). Returns False (changing nothing)
        when too few blocks are free. Raises: ValueError for ``cached`` blocks in this pool."""
        if cached:
            raise ValueError("this pool caches no prefixes: use prefix_cache.PrefixCachingBlockManager")
        table = self.block_tables.get(request_id, [])
        extra = self.blocks_needed(num_tokens) - len(table)
        if extra > self.num_free_blocks:
            return False
        self.block_tables[request_id] = table
        for _ in range(max(extra, 0)):
            block = self._take_free()
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def _take_free(self) -> int:
        """The lowest free block."""
        block = heapq.heappop(self._free)
        self.num_blocks_touched = max(self.num_blocks_touched, block + 1)
        return block

    def _release(self, block: int) -> None:
        """Drop one reference; a block no request holds is free again."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            heapq.heappush(self._free, block)

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Return the blocks past the first ``num_tokens`` tokens (after rejected draft tokens)."""
        table = self.block_tables.get(request_id)
        if table is None:
            return
        keep = self.blocks_needed(num_tokens)
        while len(table) > keep:
            self._release(table.pop())

    def free(self, request_id: str) -> None:
        """Drop the request's hold on each of its blocks (finish, abort, preemption), last first."""
        for block in reversed(self.block_tables.pop(request_id, ())):
            self._release(block)

    def slots(self, request_id: str, positions: list[int]) -> list[int]:
        """Flat slot index (block * block_size + offset) of each of a request's token ``positions``."""
        table, bs = self.block_tables[request_id], self.block_size
        return [table[p // bs] * bs + p % bs for p in positions]

    # -- what a prefix cache adds (prefix_cache.py); here nothing is ever cached --------------------
    def cached_prefix(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """The cached blocks ``token_ids`` start with: none without a prefix cache."""
        return []

    def cache_blocks(self, request_id: str, token_ids: list[int], num_tokens: int) -> None:
        """Register a request's full blocks in the prefix cache: nothing to do without one."""

    def reset_prefix_cache(self) -> None:
        """Forget every cached block. Raises: ValueError while a request holds blocks."""
        if self.num_used_blocks:
            raise ValueError(f"reset_prefix_cache: {self.num_used_blocks} blocks are held by requests; "
                             "reset only when none runs")

    def _idle_blocks(self) -> list[int]:
        """Every block no request holds, as the pool lists them."""
        return list(self._free)

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is held (its reference count = the tables it
        sits in, once each) or free, never both."""
        held = Counter(b for table in self.block_tables.values() for b in table)
        for table in self.block_tables.values():
            assert len(table) == len(set(table)), "a block sits twice in one block table"
        for block, refs in enumerate(self.ref_counts):
            assert refs == held[block], \
                f"block {block} sits in {held[block]} block tables but has {refs} references"
        idle = self._idle_blocks()
        assert len(idle) == len(set(idle)), "a block is twice in the free list"
        assert not set(idle) & set(held), "a block is both free and in a table"
        assert len(held) + len(idle) == self.num_blocks, "a block was lost"
