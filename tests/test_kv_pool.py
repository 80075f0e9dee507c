"""Pool sizing (minispec/build/pool.py): one KV budget in bytes covers the target's and the draft's
pools, split by their bytes per token, and the split is logged at start-up."""

import logging

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.models.llama import LlamaModel

from conftest import tiny_config


def test_the_kv_budget_covers_the_target_and_draft_pools(caplog):
    """Issue 15, fault 4: with a draft model, kv_cache_bytes holds both pools, split by their bytes
    per token, and the split is logged at start-up."""
    budget = 1 << 20
    target = LlamaModel.random(tiny_config(), seed=0)
    draft = LlamaModel.random(tiny_config(num_layers=1), seed=1)
    config = EngineConfig(model="tiny", device="cpu", block_size=4, kv_cache_bytes=budget, max_model_len=128,
                          spec=SpecConfig(method="draft"))
    with caplog.at_level(logging.INFO, logger="minispec"):
        engine = build_engine(config, model=target, draft=draft)
    pools = [engine.runner.kv_cache, engine.drafter.inner.runner.kv_cache]
    sizes = [sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) for kv in pools]
    assert sum(sizes) <= budget
    assert sum(sizes) > budget - 4 * (512 + 256)  # within one block of the budget: nothing left unused
    assert sizes[0] == 2 * sizes[1]  # the draft has half the target's layers
    assert engine.drafter.inner.block_manager.num_blocks == engine.block_manager.num_blocks
    message = " ".join(r.getMessage() for r in caplog.records if r.name == "minispec")
    assert f"{engine.block_manager.num_blocks} blocks" in message and "draft" in message
    assert f"kv_cache_bytes={budget}" in message and "one budget for both pools" in message
    plain = build_engine(EngineConfig(model="tiny", device="cpu", block_size=4, kv_cache_bytes=budget,
                                      max_model_len=128), model=target)
    kv = plain.executor.runner.kv_cache
    assert budget - 4 * 512 < sum(t.numel() * t.element_size() for t in (kv.k, kv.v)) <= budget
