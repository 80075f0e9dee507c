"""The paged KV cache: a pool of fixed-size blocks, one block table per request, and a prefix cache.

Kwon et al. 2023 (PagedAttention, section 4): K/V live in blocks of ``block_size`` tokens; a
request's block table maps its logical block i to a physical block, so memory grows one block at a
time and comes back whole when the request ends. The lowest free block goes first, so the blocks
ever used are 0..n-1 with n the most ever held or cached at once: on a CPU the pool's tensors take
memory only for those (``KVCache.ready``), whatever the pool's size.

Prefix caching (vLLM's automatic prefix caching, docs.vllm.ai design/prefix_caching; SGLang keeps
a radix tree instead, Zheng et al. 2024, sec. 3): a full block is named by the hash of its tokens
chained with its parent block's hash, so one hash names the whole prefix up to the block's end. A new request whose tokens start with cached blocks
shares them (reference counts) instead of computing their K/V again. A block that no request holds
keeps its K/V and stays findable until a fresh block is needed and none is left that caches
nothing; then the least recently freed cached block is evicted (LRU). The hash is only an index:
tokens and parent are compared too, so a collision costs a miss, never wrong K/V.
Invariants kept here: every block is held (reference count = the number of tables it sits in),
free, or free and cached, never two of these; once no request holds a block it is free or cached.
Taught in notebooks/00_quickstart.ipynb and notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

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


class BlockManager:
    """Free list, block tables and the prefix cache. Pure bookkeeping: no tensors, so the simulator
    shares it.

    Args:
        num_blocks: blocks in the pool.
        block_size: tokens per block.
        enable_prefix_caching: full blocks stay findable by their tokens (``cached_prefix``) once
            registered (``cache_blocks``); off, ``cached_prefix`` finds nothing and a freed block
            is simply free.
        memory_follows_use: a new block evicts a cached one before a block never used is taken,
            so a pool whose memory is committed as blocks are first used (a CPU's, see KVCache)
            grows only to the most blocks held at once, the cache living in what is left of that;
            off (a GPU's pool, allocated whole), blocks never used go first and the cache keeps
            more. ``memory_follows_use(device_type)`` says which a device uses; the simulator's
            pool takes the one of the device it models.
    Raises: ValueError for num_blocks or block_size below 1.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 memory_follows_use: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks={num_blocks}, block_size={block_size}: both must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.memory_follows_use = memory_follows_use
        self._free: list[int] = list(range(num_blocks))  # a min-heap of free blocks that cache nothing
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recently freed first
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[str, list[int]] = {}
        self._cached: dict[int, int] = {}  # block hash -> block
        self._contents: dict[int, CachedBlock] = {}  # block -> what it caches
        # request -> (its leading blocks registered or matched, the last one's hash and entry id);
        # None once a hash collision stopped its registration
        self._chains: dict[str, tuple[int, int, int] | None] = {}
        self._num_entries = 0
        self.num_blocks_touched = 0  # blocks 0..num_blocks_touched-1 have been handed out

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds: free, or cached and evictable."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks some request holds (shared ones count once)."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by their tokens, held or not."""
        return len(self._contents)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- the prefix cache -------------------------------------------------------------------------
    def cached_prefix(self, token_ids: list[int], max_tokens: int) -> list[int]:
        """The blocks holding the longest cached prefix of ``token_ids`` in whole blocks within its
        first ``max_tokens`` tokens, in order; [] when prefix caching is off. Changes nothing: give
        the blocks to ``allocate`` to share them."""
        blocks: list[int] = []
        if not self.enable_prefix_caching:
            return blocks
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
        if not self.enable_prefix_caching or chain is None:
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
        if self.num_used_blocks:
            raise ValueError(f"reset_prefix_cache: {self.num_used_blocks} blocks are held by requests; "
                             "reset only when none runs")
        for block in self._evictable:
            heapq.heappush(self._free, block)
        self._evictable.clear()
        self._contents.clear()
        self._cached.clear()

    # -- block tables -----------------------------------------------------------------------------
    def allocate(self, request_id: str, num_tokens: int, cached: list[int] = ()) -> bool:
        """Grow the table of ``request_id`` to cover ``num_tokens`` tokens. A request that holds no
        table yet may start it with ``cached`` blocks (from ``cached_prefix``), which it shares.

        Returns False (and changes nothing) when the pool has too few free blocks.
        Raises: ValueError for ``cached`` blocks given to a request that already holds a table.
        """
        table = self.block_tables.get(request_id)
        if cached and table is not None:
            raise ValueError(f"request {request_id!r} holds blocks already: only a new table starts with cached ones")
        extra = self.blocks_needed(num_tokens) - (len(cached) if table is None else len(table))
        revived = sum(self.ref_counts[b] == 0 for b in cached)  # a hit takes these out of the free pool
        if extra > self.num_free_blocks - revived:
            return False
        if table is None:
            table = self.block_tables[request_id] = []
            self._chains[request_id] = (0, ROOT_HASH, 0)
            for block in cached:
                if self.ref_counts[block] == 0:
                    del self._evictable[block]
                self.ref_counts[block] += 1
                table.append(block)
            if cached:
                last = self._contents[cached[-1]]
                self._chains[request_id] = (len(cached), last.block_hash, last.entry_id)
        for _ in range(max(extra, 0)):
            block = self._take_free()
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def _take_free(self) -> int:
        """A block for new K/V: the lowest free one that caches nothing, else the least recently
        freed cached one, whose content is forgotten (evicted); with ``memory_follows_use`` a
        cached one is evicted before a block is used for the first time."""
        never_used = bool(self._free) and self._free[0] >= self.num_blocks_touched
        if self._free and not (never_used and self.memory_follows_use and self._evictable):
            block = heapq.heappop(self._free)
            self.num_blocks_touched = max(self.num_blocks_touched, block + 1)
            return block
        block, _ = self._evictable.popitem(last=False)
        del self._cached[self._contents.pop(block).block_hash]
        return block

    def _release(self, block: int) -> None:
        """Drop one reference; a block no request holds becomes free, or evictable if it is cached."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if block in self._contents:
                self._evictable[block] = None  # the most recently freed: evicted last
            else:
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
        """Drop the request's hold on each of its blocks (finish, abort, preemption). Its last block
        goes first, so a prefix's later blocks are evicted before the earlier ones they extend."""
        for block in reversed(self.block_tables.pop(request_id, ())):
            self._release(block)
        self._chains.pop(request_id, None)

    def slot(self, request_id: str, position: int) -> int:
        """Flat slot index (block * block_size + offset) of token ``position`` of a request."""
        table = self.block_tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def check_invariants(self) -> None:
        """Raise AssertionError unless every block is in exactly one state, held (its reference
        count = the tables it sits in, once each), free, or free and cached, and every cached block
        is found by its hash."""
        held = Counter(b for table in self.block_tables.values() for b in table)
        for table in self.block_tables.values():
            assert len(table) == len(set(table)), "a block sits twice in one block table"
        for block, refs in enumerate(self.ref_counts):
            assert refs == held[block], f"block {block} sits in {held[block]} block tables but has {refs} references"
        free, evictable, cached = set(self._free), set(self._evictable), set(self._contents)
        assert len(free) == len(self._free), "a block is twice in the free list"
        assert not free & evictable, "a block is in the free list and among the evictable cached blocks"
        assert not (free | evictable) & set(held), "a block is both free and in a table"
        assert len(held) + len(free) + len(evictable) == self.num_blocks, "a block was lost"
        assert evictable <= cached and not free & cached, "a free block is listed as caching what it does not"
        assert {c.block_hash: b for b, c in self._contents.items()} == self._cached, "a cached block is not found"


class KVCache:
    """The K/V tensors: per layer ``[num_blocks, block_size, Hkv, D]`` for K and for V, and, for a
    target an EAGLE head drafts from, its features ``[num_blocks, block_size, F]`` (what the head
    reads at each position: kept by slot like K/V, so they are rolled back, moved after a tree
    verify and shared by the prefix cache exactly as K/V are).

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
        feature_dim: F, the width of the features kept per position (0: none).
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str, feature_dim: int = 0):
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.features = (torch.empty((num_blocks, block_size, feature_dim), dtype=dtype, device=device)
                         if feature_dim else None)
        self.block_size = block_size
        self.num_blocks_ready = 0  # blocks 0..num_blocks_ready-1 are zeroed or written

    def ready(self, num_blocks: int) -> None:
        """Zero blocks ``num_blocks_ready..num_blocks-1`` before their first use (see the class doc)."""
        if num_blocks > self.num_blocks_ready:
            self.k[:, self.num_blocks_ready:num_blocks].zero_()
            self.v[:, self.num_blocks_ready:num_blocks].zero_()
            if self.features is not None:
                self.features[self.num_blocks_ready:num_blocks].zero_()
            self.num_blocks_ready = num_blocks

    @property
    def num_bytes_ready(self) -> int:
        """Bytes of the blocks in use so far, K and V (what the pool holds in memory on a CPU)."""
        per_block = self.k[:, :1].numel() * self.k.element_size() * 2
        if self.features is not None:
            per_block += self.features[:1].numel() * self.features.element_size()
        return per_block * self.num_blocks_ready


def memory_follows_use(device_type: str) -> bool:
    """Whether a KV pool on a device of ``device_type`` (torch's ``device.type``: "cpu", "cuda",
    ...) commits memory as its blocks are first used, so its BlockManager should evict a cached
    block before touching a never-used one (``BlockManager(memory_follows_use=...)``): True on a
    CPU, whose operating system backs only the pages written (``KVCache.ready``); False on an
    accelerator, whose pool is allocated whole up front, so a never-used block costs nothing more
    and keeping cached blocks longer only gains hits. The real engine and the simulator (for the
    device it models) both ask this, so they evict alike and schedule the same batches."""
    return device_type == "cpu"


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
