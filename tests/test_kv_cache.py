"""BlockManager bookkeeping: allocation grows by blocks, trim and free return them, nothing is lost;
the prefix cache names blocks by chained hashes, counts references and evicts least recently freed."""

import pytest

from minispec import prefix_cache
from minispec.block_manager import BlockManager
from minispec.prefix_cache import PrefixCachingBlockManager


def test_allocate_grows_one_block_at_a_time_and_free_returns_all():
    bm = BlockManager(8, 4)
    assert bm.allocate("a", 1) and len(bm.block_tables["a"]) == 1
    assert bm.allocate("a", 4) and len(bm.block_tables["a"]) == 1
    assert bm.allocate("a", 5) and len(bm.block_tables["a"]) == 2
    assert bm.allocate("b", 12) and bm.num_free_blocks == 3
    bm.check_invariants()
    bm.free("a")
    assert bm.num_free_blocks == 5 and "a" not in bm.block_tables
    bm.free("b")
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_allocation_failure_changes_nothing():
    bm = BlockManager(3, 4)
    assert bm.allocate("a", 8)
    assert not bm.allocate("b", 8)
    assert "b" not in bm.block_tables and bm.num_free_blocks == 1
    assert not bm.allocate("a", 13)
    assert len(bm.block_tables["a"]) == 2


def test_trim_frees_blocks_past_the_kept_tokens_and_slots_follow_the_table():
    bm = BlockManager(8, 4)
    bm.allocate("a", 14)
    table = list(bm.block_tables["a"])
    assert bm.slot("a", 5) == table[1] * 4 + 1
    bm.trim("a", 6)
    assert bm.block_tables["a"] == table[:2] and bm.num_free_blocks == 6


def test_invariant_check_catches_a_block_shared_without_a_reference():
    bm = BlockManager(4, 2)
    bm.allocate("a", 2)
    bm.block_tables["b"] = list(bm.block_tables["a"])
    with pytest.raises(AssertionError, match="sits in 2 block tables but has 1 references"):
        bm.check_invariants()


def test_bad_pool():
    with pytest.raises(ValueError, match="num_blocks=0"):
        BlockManager(0, 16)


def test_the_kv_budget_covers_the_target_and_draft_pools(caplog):
    """Issue 15, fault 4: with a draft model, kv_cache_bytes holds both pools, split by their bytes
    per token, and the split is logged at start-up."""
    import logging

    from minispec.build import build_engine
    from minispec.config import EngineConfig, SpecConfig
    from minispec.models.llama import LlamaModel

    from conftest import tiny_config

    budget = 1 << 20
    target = LlamaModel.random(tiny_config(), seed=0)
    draft = LlamaModel.random(tiny_config(num_layers=1), seed=1)
    config = EngineConfig(model="tiny", device="cpu", block_size=4, kv_cache_bytes=budget, max_model_len=128,
                          spec=SpecConfig(method="draft"))
    with caplog.at_level(logging.INFO, logger="minispec"):
        engine = build_engine(config, model=target, draft=draft)
    pools = [engine.executor.runner.kv_cache, engine.executor.drafter.inner.runner.kv_cache]
    sizes = [sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) for kv in pools]
    assert sum(sizes) <= budget
    assert sum(sizes) > budget - 4 * (512 + 256)  # within one block of the budget: nothing left unused
    assert sizes[0] == 2 * sizes[1]  # the draft has half the target's layers
    assert engine.executor.drafter.inner.block_manager.num_blocks == engine.block_manager.num_blocks
    message = " ".join(r.getMessage() for r in caplog.records if r.name == "minispec")
    assert f"{engine.block_manager.num_blocks} blocks" in message and "draft" in message
    assert f"kv_cache_bytes={budget}" in message and "one budget for both pools" in message
    plain = build_engine(EngineConfig(model="tiny", device="cpu", block_size=4, kv_cache_bytes=budget,
                                      max_model_len=128), model=target)
    kv = plain.executor.runner.kv_cache
    assert budget - 4 * 512 < sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) <= budget


# -- the prefix cache ---------------------------------------------------------------------------------

def computed(bm: BlockManager, rid: str, tokens: list[int]) -> None:
    """Admit ``rid`` with its cached prefix, then "compute" the rest and register its full blocks,
    as the scheduler does."""
    bm.allocate(rid, len(tokens), bm.cached_prefix(tokens, len(tokens) - 1))
    bm.cache_blocks(rid, tokens, len(tokens))
    bm.check_invariants()


def test_a_block_is_named_by_its_tokens_and_all_before_them():
    bm = PrefixCachingBlockManager(16, 4)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    a = bm.block_tables["a"]
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], 8) == a[:2]
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8], 7) == a[:1]  # whole blocks within the limit only
    assert bm.cached_prefix([1, 2, 3, 4, 0, 6, 7, 8], 8) == a[:1]
    assert bm.cached_prefix([0, 2, 3, 4, 5, 6, 7, 8], 8) == []  # block 1's tokens under another parent
    assert prefix_cache.hash_block(prefix_cache.ROOT_HASH, (5, 6, 7, 8)) != \
        prefix_cache.hash_block(prefix_cache.hash_block(prefix_cache.ROOT_HASH, (1, 2, 3, 4)), (5, 6, 7, 8))
    assert BlockManager(16, 4).cached_prefix([1, 2, 3, 4, 5], 4) == []  # prefix caching off finds nothing


def test_shared_blocks_are_reference_counted_and_cached_once_nobody_holds_them():
    bm = PrefixCachingBlockManager(8, 4)
    prefix = [1, 2, 3, 4, 5, 6, 7, 8]
    computed(bm, "a", prefix + [9])
    computed(bm, "b", prefix + [10, 11])
    shared = bm.block_tables["a"][:2]
    assert bm.block_tables["b"][:2] == shared and bm.block_tables["b"][2] != bm.block_tables["a"][2]
    assert [bm.ref_counts[b] for b in shared] == [2, 2] and bm.num_used_blocks == 4
    bm.free("a")
    bm.check_invariants()
    assert [bm.ref_counts[b] for b in shared] == [1, 1] and bm.num_used_blocks == 3  # b still holds them
    bm.free("b")
    bm.check_invariants()
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2  # free, and still found
    assert bm.cached_prefix(prefix + [0], 8) == shared


def test_eviction_takes_the_least_recently_freed_cached_block_and_a_hit_protects_one():
    bm = PrefixCachingBlockManager(4, 2)
    for rid, tokens in (("a", [1, 1]), ("b", [2, 2]), ("c", [3, 3])):  # one full block each
        computed(bm, rid, tokens)
    blocks = {rid: bm.block_tables[rid][0] for rid in "abc"}
    for rid in "abc":
        bm.free(rid)  # a's block is freed first, c's last
    assert bm.num_cached_blocks == 3 and bm.num_free_blocks == 4
    computed(bm, "d", [2, 2, 0])  # a hit: b's block is held again, and the one uncached block
    assert bm.block_tables["d"][0] == blocks["b"] and bm.num_free_blocks == 2
    assert bm.allocate("e", 2)  # no uncached block is left: the least recently freed cached one, a's
    assert bm.cached_prefix([1, 1, 0], 2) == [] and bm.cached_prefix([3, 3, 0], 2) == [blocks["c"]]
    bm.check_invariants()
    assert bm.allocate("f", 2)  # then c's; b's is held
    assert bm.cached_prefix([3, 3, 0], 2) == [] and bm.cached_prefix([2, 2, 0], 2) == [blocks["b"]]
    assert not bm.allocate("g", 2)
    bm.check_invariants()


def test_allocating_with_a_hit_counts_the_revived_blocks_and_a_failure_changes_nothing():
    bm = PrefixCachingBlockManager(4, 2)
    computed(bm, "a", [1, 2, 3, 4, 5])
    bm.free("a")  # 2 cached blocks evictable, 2 free
    hit = bm.cached_prefix([1, 2, 3, 4, 9, 9, 9, 9, 9, 9], 9)
    assert len(hit) == 2
    assert not bm.allocate("b", 10, hit)  # 3 more blocks, but only 2 are free besides the hit
    assert "b" not in bm.block_tables and bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    bm.check_invariants()
    assert bm.allocate("b", 8, hit) and bm.block_tables["b"][:2] == hit and bm.num_free_blocks == 0
    with pytest.raises(ValueError, match="holds blocks already"):
        bm.allocate("b", 8, hit)
    bm.check_invariants()


def test_a_forced_hash_collision_reuses_no_kv(monkeypatch):
    """Every block gets the same hash: a lookup must still compare tokens and parents, so a
    different prefix never gets these K/V, and a request that collides stops registering."""
    monkeypatch.setattr(prefix_cache, "hash_block", lambda parent_hash, token_ids: 7)
    bm = PrefixCachingBlockManager(16, 4)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    first = bm.block_tables["a"][0]
    assert bm.num_cached_blocks == 1  # block 1 collided with block 0 and stayed private
    assert bm.cached_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0], 8) == []  # same hash, other tokens
    assert bm.cached_prefix([1, 2, 3, 4, 1, 2, 3, 4, 0], 8) == [first]  # block 1 = block 0's tokens, other parent
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], 8) == [first]
    computed(bm, "b", [9, 9, 9, 9, 0])
    assert bm.block_tables["b"][0] != first and bm.num_cached_blocks == 1


def test_reset_forgets_every_cached_block_only_when_none_is_held():
    bm = PrefixCachingBlockManager(8, 4)
    computed(bm, "a", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="held by requests"):
        bm.reset_prefix_cache()
    bm.free("a")
    bm.reset_prefix_cache()
    bm.check_invariants()
    assert bm.num_cached_blocks == 0 and bm.cached_prefix([1, 2, 3, 4, 5], 4) == [] and bm.num_free_blocks == 8


def test_a_pool_whose_memory_follows_use_evicts_before_touching_a_new_block():
    """With prefix caching, freed cached blocks stay; a pool whose memory is committed on first use
    (a CPU's) evicts them before it takes a block never used, so it touches only as many blocks as
    were ever held at once. A GPU-style pool takes the never-used blocks first and caches more."""
    touched = {}
    for follows in (False, True):
        bm = PrefixCachingBlockManager(64, 4, memory_follows_use=follows)
        for i in range(10):  # ten requests one after another, 3 blocks each, no shared prefix
            tokens = [100 * i + j for j in range(12)]
            assert bm.allocate(f"r{i}", 12)
            bm.cache_blocks(f"r{i}", tokens, 12)
            bm.free(f"r{i}")
            bm.check_invariants()
        touched[follows] = bm.num_blocks_touched
        cached_now = bm.num_cached_blocks
    assert touched[True] == 3 and touched[False] == 30
    assert cached_now == 3  # the cache lives in the memory already used: the last request's blocks
