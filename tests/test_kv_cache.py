"""BlockManager bookkeeping: allocation grows by blocks, trim and free return them, nothing is lost."""

import pytest

from minispec.kv_cache import BlockManager


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


def test_invariant_check_catches_a_shared_block():
    bm = BlockManager(4, 2)
    bm.allocate("a", 2)
    bm.block_tables["b"] = list(bm.block_tables["a"])
    with pytest.raises(AssertionError, match="two block tables"):
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
    pools = [engine.executor.runner.kv_cache, engine.executor.drafter.runner.kv_cache]
    sizes = [sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) for kv in pools]
    assert sum(sizes) <= budget
    assert sum(sizes) > budget - 4 * (512 + 256)  # within one block of the budget: nothing left unused
    assert sizes[0] == 2 * sizes[1]  # the draft has half the target's layers
    assert engine.executor.drafter.block_manager.num_blocks == engine.block_manager.num_blocks
    message = " ".join(r.getMessage() for r in caplog.records if r.name == "minispec")
    assert f"{engine.block_manager.num_blocks} blocks" in message and "draft" in message
    assert f"kv_cache_bytes={budget}" in message and "one budget for both pools" in message
    plain = build_engine(EngineConfig(model="tiny", device="cpu", block_size=4, kv_cache_bytes=budget,
                                      max_model_len=128), model=target)
    kv = plain.executor.runner.kv_cache
    assert budget - 4 * 512 < sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) <= budget
