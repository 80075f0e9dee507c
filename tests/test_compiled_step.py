"""The captured CPU step (minispec/graphs/compiled_step.py): one compiled forward per bucket.

Greedy output with ``compile=True`` equals the eager engine's, token for token, for plain decoding and
every speculation path (n-gram, a draft model, a draft tree, an EAGLE head reading the target's final
features from the captured step; an EAGLE-3 head, which reads inner layers, keeps its target eager);
the K/V write stays in place; a compile that fails runs the step eagerly with one warning and loses
no request; a machine without a C++ compiler is refused by name.
Tiny random models and short contexts keep the compiles to a few seconds each and few buckets.
"""

import logging

import pytest
import torch

import minispec.graphs.compiled_step as compiled_step
from minispec.base.config import EngineConfig, SpecConfig
from minispec.build.pool import use_compile
from minispec.core.request import SamplingParams
from minispec.graphs.compiled_step import CompiledStepRunner, compile_unavailable, context, context_rows
from minispec.graphs.cuda_graphs import GraphModelRunner
from minispec.models.eagle import build_eagle
from minispec.models.llama import LlamaModel

from conftest import tiny_config, tiny_engine

pytestmark = [pytest.mark.kernels,
              pytest.mark.skipif(compile_unavailable() is not None, reason="no C++ compiler for torch.compile")]

TARGET = LlamaModel.random(tiny_config(num_layers=2), seed=11)
DRAFT = LlamaModel.random(tiny_config(num_layers=1), seed=12)
EAGLE = build_eagle(TARGET, torch.arange(TARGET.cfg.vocab_size)).eval().requires_grad_(False)
PROMPTS = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 7, 7, 8], [20, 21, 22]]

PATHS = {
    "plain": (None, None),
    "ngram": (SpecConfig(method="ngram", num_speculative_tokens=3), None),
    "draft": (SpecConfig(method="draft", num_speculative_tokens=3), DRAFT),
    "tree": (SpecConfig(method="draft", num_speculative_tokens=2, draft_topk=2, num_draft_tokens=4), DRAFT),
    "eagle": (SpecConfig(method="draft", num_speculative_tokens=3), (EAGLE, None, None)),
}


def greedy(compile_step: bool, spec, draft, max_tokens: int = 8):
    """Greedy outputs of PROMPTS (blocks of 16 tokens: every context fits one or two, so few buckets)."""
    engine = tiny_engine(TARGET, spec=spec, draft=draft, compile=compile_step, kernels="fast", block_size=16)
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
           for p in PROMPTS]
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert all(outs[i].error is None for i in ids)
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    return [outs[i].output_token_ids for i in ids], engine


@pytest.mark.parametrize("path", list(PATHS))
def test_compiled_greedy_equals_eager_greedy(path):
    spec, draft = PATHS[path]
    eager, _ = greedy(False, spec, draft)
    captured, engine = greedy(True, spec, draft)
    assert captured == eager
    runner = engine.runner  # an EAGLE head reads the final features, which the captured step returns
    assert isinstance(runner, CompiledStepRunner) and runner.failed is None
    assert runner.num_replays > 0 and runner.compile_s  # steps really ran compiled
    if path in ("draft", "tree"):
        assert isinstance(engine.drafter.inner.runner, CompiledStepRunner)


def test_a_head_that_reads_inner_layers_keeps_its_target_eager_and_a_last_layer_head_does_not():
    """The captured step returns the final features only: an EAGLE head of the last layer drafts
    from a compiled target (the greedy test above), an EAGLE-3 head reading an inner layer from an
    eager one, with the same tokens."""
    eagle3 = build_eagle(TARGET, torch.arange(TARGET.cfg.vocab_size), feature_layers=(0,)).eval()
    spec = SpecConfig(method="draft", num_speculative_tokens=3)
    eager, _ = greedy(False, spec, (eagle3.requires_grad_(False), None, None))
    captured, engine = greedy(True, spec, (eagle3, None, None))
    assert captured == eager and not isinstance(engine.runner, CompiledStepRunner)


def test_the_compiled_step_matches_the_eager_logits_and_writes_kv_in_place():
    engine = tiny_engine(TARGET, compile=True, kernels="fast", block_size=16)
    runner = engine.runner
    cache = runner.kv_cache.k.data_ptr()
    rid = engine.add_request([3, 1, 4, 1, 5], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert engine.requests[rid].num_output_tokens == 4 and runner.num_replays >= 3
    assert runner.kv_cache.k.data_ptr() == cache  # the write happened in the engine's own cache
    # the same bucket, eager against compiled, on the same buffers
    key, = runner.compile_s  # one compile for (B, Q) = (1, 1), whatever the context
    step = runner.compiled
    graph = next(g for k, g in runner.graphs.items() if k[:2] == key)
    inputs = (graph.input_ids, graph.positions, graph.slots, graph.block_tables, graph.mask)
    with torch.inference_mode():
        features, logits, new_k, new_v = step(*inputs)
        GraphModelRunner._run(runner, graph)  # the eager padded step: core/attention's write, gather, SDPA
    torch.testing.assert_close(logits, graph.logits, rtol=1e-4, atol=1e-4)
    # the K/V the graph hands back are what the eager step wrote into the cache at the step's slots
    for new, cache in ((new_k, runner.kv_cache.k), (new_v, runner.kv_cache.v)):
        torch.testing.assert_close(new, cache.flatten(1, 2)[:, graph.slots], rtol=1e-4, atol=1e-4)


def test_a_token_s_place_in_the_gathered_context_and_a_padding_token_s_spare_row():
    """Row 0 holds blocks 5 and 2 (block size 4, so S = 8): its token in block 2 at offset 1 sits at
    0 * 8 + 1 * 4 + 1; a padding token of row 0 writes to the pad block (7), which row 0 does not
    hold, so it goes to the spare row B * S = 16 and no real key is overwritten; a padding row's
    tokens land in that row's own context (block 7 is its first block)."""
    slots = torch.tensor([2 * 4 + 1, 7 * 4, 7 * 4, 7 * 4])
    block_tables = torch.tensor([[5, 2], [7, 0]])
    assert context_rows(slots, block_tables, 4).tolist() == [5, 16, 8, 8]
    cache = torch.arange(8 * 4 * 1 * 1, dtype=torch.float32).view(8, 4, 1, 1)
    new = torch.tensor([[[-1.0]], [[-2.0]], [[-3.0]], [[-3.0]]])
    ctx = context(cache, block_tables, new, context_rows(slots, block_tables, 4))  # [B, Hkv, S, D]
    assert ctx[0, 0, :, 0].tolist() == [20, 21, 22, 23, 8, -1, 10, 11]  # block 5, then block 2 with the new key
    assert ctx[1, 0, 0, 0] == -3 and ctx[1, 0, 1:4, 0].tolist() == [29, 30, 31]


def test_a_failed_compile_runs_eagerly_with_one_warning_and_loses_no_request(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(compiled_step.torch, "compile", broken)
    eager, _ = greedy(False, None, None, max_tokens=6)
    with caplog.at_level(logging.WARNING, logger="minispec"):
        captured, engine = greedy(True, None, None, max_tokens=6)
    assert captured == eager
    assert "RuntimeError: no compiler today" in engine.runner.failed
    warnings = [r for r in caplog.records if "failed to compile" in r.getMessage()]
    assert len(warnings) == 1


def test_compile_is_off_by_default_and_refused_without_a_compiler(monkeypatch):
    assert use_compile(None, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="compile='yes'"):
        EngineConfig(compile="yes")
    with pytest.raises(ValueError, match="this engine runs on meta"):
        use_compile(True, torch.device("meta"))
    monkeypatch.setattr(compiled_step.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="C\\+\\+ compiler .* is not on PATH"):
        use_compile(True, torch.device("cpu"))
