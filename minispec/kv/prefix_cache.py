"""The prefix cache: a block pool in which full blocks stay findable by the tokens they hold.

vLLM's automatic prefix caching (docs.vllm.ai design/prefix_caching; SGLang keeps a radix tree
instead, Zheng et al. 2024, sec. 3): a full block is named by the hash of its tokens chained with
its parent block's hash, so one hash names the whole prefix up to the block's end. A new request
whose tokens start with cached blocks shares them (reference counts) instead of computing their
K/V again. A block that no request holds keeps its K/V and stays findable until a fresh block is
needed and none is left that caches nothing; then the least recently freed cached block is
evicted (LRU). The hash is only an index: tokens and parent are compared too, so a collision
costs a miss, never wrong K/V.
Invariants: every block is held, free, or free and cached, never two of these; once no request
holds a block it is free or cached. ``PrefixCachingBlockManager`` subclasses the core
``BlockManager`` (minispec/core/block_manager.py): the scheduler asks the same questions of both.
Taught in notebooks/10_packed_device_lab.ipynb.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from minispec.core.block_manager import BlockManager

ROOT_HASH = 0  # the parent hash of a sequence's first block (an int: hash(None) differs between runs)


def hash_block(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """The hash that names a full block: its tokens chained with its parent block's hash
    (``ROOT_HASH`` for the first block), so equal hashes mean equal prefixes, barring collisions.
    Python's tuple hash: 64 bits, the same in every run for integers (vLLM offers it beside sha256)."""
    return hash((parent_hash, token_ids))


@dataclass(frozen=True)
class CachedBlock:
    """What a cached block holds: the hash that names it, its parent's ``entry_id`` (0 for a first
    block) and its tokens. ``entry_id`` is given once per registration and never reused, so a child
    names exactly one parent: not another block whose hash collides with the parent's, nor the
    parent's physical block after it was evicted and reused."""

    block_hash: int
    parent_id: int
    token_ids: tuple[int, ...]
    entry_id: int


class PrefixCachingBlockManager(BlockManager):
    """A BlockManager whose full blocks stay findable by their tokens (``cached_prefix``) once
    registered (``cache_blocks``).

    Args:
        num_blocks, block_size: as BlockManager.
        memory_follows_use: a new block evicts a cached one before a block never used is taken,
            so a pool whose memory is committed as blocks are first used (a CPU's, see KVCache)
            grows only to the most blocks held at once, the cache living in what is left of that;
            off (a GPU's pool, allocated whole), blocks never used go first and the cache keeps
            more. ``build.pool.memory_follows_use(device_type)`` says which a device uses; the
            simulator's pool takes the one of the device it models.
    Raises: ValueError for num_blocks or block_size below 1.
    """

    enable_prefix_caching = True

    def __init__(self, num_blocks: int, block_size: int, memory_follows_use: bool = False):
        super().__init__(num_blocks, block_size)
        self.memory_follows_use = memory_follows_use
        # free cached blocks, least recently freed first
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[int, int] = {}  # block hash -> block
        self._contents: dict[int, CachedBlock] = {}  # block -> what it caches
        # request -> (its leading blocks registered or matched, the last one's hash and entry id);
        # None once a hash collision stopped its registration
        self._chains: dict[str, tuple[int, int, int] | None] = {}
        self._num_entries = 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: free, or cached and evictable."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by their tokens, held or not."""
        return len(self._contents)

    def cached_prefix(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """The blocks holding the longest cached prefix of ``token_ids`` in whole blocks within its
        first ``max_tokens`` tokens, in order. Changes nothing: give the blocks to ``allocate`` to
        share them."""
        blocks: list[int] = []
        bs, parent_hash, parent_id = self.block_size, ROOT_HASH, 0
        for start in range(0, max_tokens - bs + 1, bs):
            tokens = tuple(token_ids[start: start + bs])
            block_hash = hash_block(parent_hash, tokens)
            block = self._find(block_hash, parent_id, tokens)
            if block is None:
                break
            blocks.append(block)
            parent_hash, parent_id = block_hash, self._contents[block].entry_id
        return blocks

    def _find(self, block_hash: int, parent_id: int, tokens: tuple[int, ...]) -> int | None:
        """The cached block with this hash, if it holds these tokens under this parent."""
        block = self._cached.get(block_hash)
        if block is None:
            return None
        content = self._contents[block]
        return block if content.parent_id == parent_id and content.token_ids == tokens else None

    def cache_blocks(self, request_id: str, token_ids: list[int], num_tokens: int) -> None:
        """Register the full blocks of ``request_id`` within its first ``num_tokens`` tokens, whose
        K/V are final (the scheduler passes the tokens computed). A block whose prefix another
        request cached first stays private: the first copy is the one found. After a hash
        collision nothing more of this request is registered (it only costs later hits)."""
        chain = self._chains.get(request_id)
        if chain is None:
            return
        num, parent_hash, parent_id = chain
        table, bs = self.block_tables[request_id], self.block_size
        while num < min(num_tokens // bs, len(table)):
            tokens = tuple(token_ids[num * bs: (num + 1) * bs])
            block_hash = hash_block(parent_hash, tokens)
            block = self._find(block_hash, parent_id, tokens)
            if block is None:
                if block_hash in self._cached:  # another prefix holds this hash
                    self._chains[request_id] = None
                    return
                block = table[num]
                self._num_entries += 1
                self._contents[block] = CachedBlock(block_hash, parent_id, tokens, self._num_entries)
                self._cached[block_hash] = block
            parent_hash, parent_id, num = block_hash, self._contents[block].entry_id, num + 1
        self._chains[request_id] = (num, parent_hash, parent_id)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (a benchmark row starts cold, as a fresh server does).

        Raises: ValueError while a request holds blocks.
        """
        super().reset_prefix_cache()
        for block in self._evictable:
            self._free.append(block)
        self._free.sort()  # a sorted list is a min-heap
        self._evictable.clear()
        self._contents.clear()
        self._cached.clear()

    def allocate(self, request_id: str, num_tokens: int, cached: list[int] = ()) -> bool:
        """As BlockManager.allocate; a request that holds no table yet may start it with
        ``cached`` blocks (from ``cached_prefix``), which it shares.

        Raises: ValueError for ``cached`` blocks given to a request that already holds a table.
        """
        if request_id in self.block_tables:
            if cached:
                raise ValueError(f"request {request_id!r} holds blocks already: "
                                 "only a new table starts with cached ones")
            return super().allocate(request_id, num_tokens)
        revived = sum(self.ref_counts[b] == 0 for b in cached)  # a hit takes these out of the free pool
        if self.blocks_needed(num_tokens) - len(cached) > self.num_free_blocks - revived:
            return False
        table = self.block_tables[request_id] = []
        for block in cached:
            if self.ref_counts[block] == 0:
                del self._evictable[block]
            self.ref_counts[block] += 1
            table.append(block)
        last = self._contents[cached[-1]] if cached else None
        self._chains[request_id] = ((len(cached), last.block_hash, last.entry_id) if cached
                                    else (0, ROOT_HASH, 0))
        return super().allocate(request_id, num_tokens)

    def _take_free(self) -> int:
        """A block for new K/V: the lowest free one that caches nothing, else the least recently
        freed cached one, whose content is forgotten (evicted); with ``memory_follows_use`` a
        cached one is evicted before a block is used for the first time."""
        never_used = bool(self._free) and self._free[0] >= self.num_blocks_touched
        if self._free and not (never_used and self.memory_follows_use and self._evictable):
            return super()._take_free()
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._contents.pop(block).block_hash]
        return block

    def _release(self, block: int) -> None:
        """Drop one reference; a block no request holds becomes free, or evictable if it is cached."""
        if self.ref_counts[block] == 1 and block in self._contents:
            self.ref_counts[block] = 0
            self._evictable[block] = None  # the most recently freed: evicted last
        else:
            super()._release(block)

    def free(self, request_id: str) -> None:
        """As BlockManager.free: its last block goes first, so a prefix's later blocks are evicted
        before the earlier ones they extend."""
        super().free(request_id)
        self._chains.pop(request_id, None)

    def _idle_blocks(self) -> list[int]:
        return list(self._free) + list(self._evictable)

    def check_invariants(self) -> None:
        """As BlockManager.check_invariants, and every free cached block is evictable, and every
        cached block is found by its hash."""
        free, evictable, cached = set(self._free), set(self._evictable), set(self._contents)
        assert not free & evictable, "a block is in the free list and among the evictable cached blocks"
        assert evictable <= cached and not free & cached, "a free block is listed as caching what it does not"
        assert {c.block_hash: b for b, c in self._contents.items()} == self._cached, \
            "a cached block is not found"
        super().check_invariants()
