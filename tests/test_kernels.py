"""Kernels and weight formats: fast kernels and bfloat16 / int8 weights against the float32
reference, speculation exact relative to the quantized target, and the fast path's divergences
from the reference confined to near ties on the bundled model."""

from __future__ import annotations

import pytest
import torch

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.block_manager import BlockManager
from minispec.base.kv_cache import KVCache
from minispec.core.model_runner import ForwardItem, ModelRunner
from minispec.models import lowbit
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.tools.workload import load_prompts

from conftest import FAST, tiny_config, tiny_engine

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

# worst |logit difference| / max |logit| against float32, per weight format (both kernel paths)
# int4: 16 levels per group of 32 random weights, compounding through the layers (the bundled
# model's agreement below is the measure that matters)
TOLERANCE = {"bfloat16": 0.03, "int8": 0.05, "int4": 0.5}
NEAR_TIE = 0.05  # logits: a fast/reference divergence must sit where the top two are this close


def logits(model, ids, kernels, weights, chunk=5):
    cfg = model.cfg
    kv = KVCache(cfg.num_layers, 32, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    runner = ModelRunner(model, kv, BlockManager(32, 4), torch.device("cpu"), kernels, weights)
    runner.block_manager.allocate("r", len(ids))
    rows = []
    for start in range(0, len(ids), chunk):
        piece = ids[start: start + chunk]
        rows.append(runner.forward([ForwardItem("r", piece, start, len(piece))]).logits[0])
    return torch.cat(rows)


def test_int8_per_channel_round_trip():
    w = torch.randn(64, 48) * torch.linspace(0.1, 3.0, 48)  # [in, out], a different range per output
    q = lowbit.quantize_int8(w)
    assert q.codes.dtype == torch.int8 and q.codes.shape == (48, 64) and q.scales.shape == (48,)
    scales = q.scales.float()
    err = ((q.codes.float() * scales[:, None]).T - w).abs()
    assert (err <= scales / 2 + 1e-6).all()  # at most half a step of its own channel's scale


@pytest.mark.parametrize("weights", ["bfloat16", "int8", "int4"])
@pytest.mark.parametrize("kernels", ["reference", "fast"])
def test_fewer_bytes_per_weight_stay_close_to_float32(kernels, weights):
    model = LlamaModel.random(tiny_config(hidden_size=128, intermediate_size=256, head_dim=32), seed=1)
    ids = torch.randint(0, 256, (17,), generator=torch.Generator().manual_seed(2)).tolist()
    before = {n: p.clone() for n, p in model.named_parameters()}
    ref = logits(model, ids, "reference", "float32")
    out = logits(model, ids, kernels, weights)
    assert (out - ref).abs().max() / ref.abs().max() < TOLERANCE[weights]  # (tiny random logits are too
    # flat for a top-1 check: the bundled model's test below measures agreement)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the model is untouched


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_fast_low_bit_agrees_with_its_reference(weights):
    """The reference path spells out what each format means (the dequantized weights, float32
    activations): the fast kernels match it up to their bfloat16 activations."""
    model = LlamaModel.random(tiny_config(hidden_size=128, intermediate_size=256, head_dim=32), seed=1)
    ids = list(range(3, 40))
    for chunk in (1, 5):  # a decode's one row and a verify's several rows block differently
        ref = logits(model, ids, "reference", weights, chunk=chunk)
        fast = logits(model, ids, "fast", weights, chunk=chunk)
        assert (fast - ref).abs().max() / ref.abs().max() < 0.02


@pytest.mark.parametrize("kernels", ["reference", "fast"])
@pytest.mark.parametrize("weights", ["bfloat16", "int8", "int4"])
def test_speculation_is_exact_for_the_quantized_target(weights, kernels):
    """On the low-bit kernels too: PyTorch's int4 and int8 CPU kernels compute each row the same
    whatever the rows beside it (a decode's one row, a verify's k + 1), so greedy speculation
    equals plain greedy decoding token for token on them."""
    if kernels == "fast" and weights == "bfloat16":
        pytest.skip("oneDNN's bfloat16 kernel blocks rows differently per row count: near ties only (below)")
    target = LlamaModel.random(tiny_config(), seed=5)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2], list(range(5, 19)), [9, 9, 9]]

    def run(spec, draft=None):
        engine = tiny_engine(target, spec=spec, draft=draft, kernels=kernels, weights=weights)
        ids = [engine.add_request(p, params) for p in prompts]
        engine.run_until_done()
        return [engine.requests[i].output_token_ids for i in ids]

    plain = run(None)
    assert run(SpecConfig(method="ngram", num_speculative_tokens=4)) == plain
    assert run(SpecConfig(method="draft", num_speculative_tokens=3), draft=target) == plain


@pytest.mark.parametrize("weights", ["bfloat16", "int8", "int4"])
def test_bundled_model_agrees_with_float32_teacher_forced(bundled, weights):
    """bfloat16, int8 and int4 keep the bundled model's greedy choices on a teacher-forced text
    (int4's codes are the file's, so the float32 model is its exact dequantization; what differs
    is bfloat16 activations, scales and the int8 head)."""
    model, tokenizer, _ = bundled
    text = ("The river runs past the old mill, where the miller keeps a ledger of every sack of grain "
            "that comes in from the valley farms each autumn.")
    ids = tokenizer(text)["input_ids"]
    ref = logits(model, ids, "reference", "float32", chunk=len(ids))
    out = logits(model, ids, "fast", weights, chunk=len(ids))
    agreement = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
    print(f"{weights}: top-1 agreement with float32 over {len(ids)} positions = {agreement:.3f}")
    assert agreement >= 0.95


@pytest.mark.skipif(FAST, reason="32 prompts x 64 tokens on the bundled model: the full suite only")
def test_fast_kernels_diverge_from_speculation_off_only_at_near_ties(bundled):
    """oneDNN blocks a product differently for different row counts (a decode's rows against a
    verify's), so on the fast path spec on and off agree to float32 rounding, not bit for bit. Every divergence must sit where the
    target's top two logits (reference kernels, same prefix) are within NEAR_TIE."""
    model, tokenizer, hf_config = bundled
    prompts = (load_prompts("chat") + load_prompts("copy"))[:32]
    params = SamplingParams(max_tokens=64, temperature=0)

    def run(spec):
        config = EngineConfig(model="bundled", device="cpu", num_kv_blocks=1024, max_model_len=1024,
                              kernels="fast", weights="float32", spec=spec or SpecConfig())
        engine = build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config)
        ids = [engine.add_request(p, params) for p in prompts]
        engine.run_until_done()
        return [(engine.requests[i].prompt_token_ids, engine.requests[i].output_token_ids) for i in ids]

    off, on = run(None), run(SpecConfig(method="ngram", num_speculative_tokens=4))
    gaps = []
    for (prompt, a), (_, b) in zip(off, on):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if n is None:
            continue
        with torch.inference_mode():
            top2 = model.forward_dense(torch.tensor([prompt + a[:n]]))[0, -1].topk(2).values
        gaps.append(float(top2[0] - top2[1]))
    print(f"fast kernels: {len(gaps)} of {len(prompts)} prompts diverge; top-2 gaps there: {gaps}")
    assert all(g < NEAR_TIE for g in gaps)


# int4: the LM head runs PyTorch's int8 kernel, whose logits come out in bfloat16 (steps of 0.125 at
# the bundled model's logit scale of 16-32), so "near" is two such steps of the int4 model's own logits
NEAR_TIE_INT4 = 0.25


@pytest.mark.skipif(FAST, reason="16 prompts x 48 tokens on the bundled model, twice: the full suite only")
def test_int4_speculation_diverges_from_plain_only_at_its_own_near_ties(bundled):
    """The int4 kernels compute a row the same whatever rows share the step, but the float32 parts
    (attention above all) block a decode's one row and a verify's k + 1 differently, and the
    bfloat16 rounding before each int4 product can turn that last-bit difference into a different
    activation. So greedy speculation on the fast int4 path equals plain decoding except where the
    int4 model's own top two logits are within NEAR_TIE_INT4 (measured: 17 of 32 prompts diverge
    within 64 tokens, every one at a gap of at most 0.25; docs/cost_model.md). The reference kernels
    are exact for int4 (test_speculation_is_exact_for_the_quantized_target)."""
    model, tokenizer, hf_config = bundled
    prompts = (load_prompts("chat") + load_prompts("copy"))[:16]
    params = SamplingParams(max_tokens=48, temperature=0)

    def run(spec):
        config = EngineConfig(model="bundled", device="cpu", num_kv_blocks=512, max_model_len=1024,
                              kernels="fast", weights="int4", spec=spec or SpecConfig())
        engine = build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config)
        ids = [engine.add_request(p, params) for p in prompts]
        engine.run_until_done()
        return engine, [(engine.requests[i].prompt_token_ids, engine.requests[i].output_token_ids) for i in ids]

    engine, off = run(None)
    _, on = run(SpecConfig(method="ngram", num_speculative_tokens=4))
    runner, gaps = engine.runner, []
    for (prompt, a), (_, b) in zip(off, on):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if n is None:
            continue
        seq = prompt + a[:n]
        runner.block_manager.allocate("tie", len(seq))
        top2 = runner.forward([ForwardItem("tie", seq, 0, 1)]).logits[0][-1].topk(2).values
        runner.block_manager.free("tie")
        gaps.append(float(top2[0] - top2[1]))
    print(f"int4: {len(gaps)} of {len(prompts)} prompts diverge; its own top-2 gaps there: {gaps}")
    assert all(g <= NEAR_TIE_INT4 for g in gaps)
