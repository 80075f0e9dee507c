"""BlockManager bookkeeping (minispec/core/block_manager.py): allocation grows by blocks, trim and free
return them, a failed allocation changes nothing, and the invariant check catches a shared block
without a reference."""

import pytest

from minispec.core.block_manager import BlockManager


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
    assert bm.slots("a", [5, 0]) == [table[1] * 4 + 1, table[0] * 4]
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
