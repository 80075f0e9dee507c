"""CUDA graphs (minispec/graphs/cuda_graphs.py): buckets, the padded static-shape step, and on a GPU the
recorded graphs themselves.

On a CPU the graph runner runs its padded buffers eagerly (``capture=False``), so every test but
the last checks the padding here: padding rows must never touch a request's K/V, and a padded step
must give the tokens an unpadded one gives. The last test records real graphs and runs only where
CUDA is present (bench/gpu/gpu_run.py measures them on a GPU).
"""

import pytest
import torch

import minispec.build.engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.graphs.cuda_graphs import GraphModelRunner, batch_buckets, bucket
from minispec.build.pool import use_cuda_graphs
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams

from conftest import tiny_config, tiny_engine

pytestmark = pytest.mark.kernels

TARGET = LlamaModel.random(tiny_config(), seed=3)
DRAFT = LlamaModel.random(tiny_config(num_layers=1), seed=4)


def test_buckets_follow_nano_vllm():
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert batch_buckets(5) == [1, 2, 4]
    assert bucket(3, [1, 2, 4, 8]) == 4
    assert bucket(9, [1, 2, 4, 8]) is None


def test_graphs_default_to_cuda_and_refuse_a_cpu():
    assert use_cuda_graphs(None, torch.device("cpu")) is False
    assert use_cuda_graphs(False, torch.device("cpu")) is False
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        use_cuda_graphs(True, torch.device("cpu"))
    with pytest.raises(ValueError, match="cuda_graphs='yes'"):
        EngineConfig(cuda_graphs="yes")


def test_a_capturing_runner_refuses_a_cpu():
    engine = tiny_engine(TARGET)
    runner = engine.runner
    with pytest.raises(ValueError, match="KVCache needs 1 block past the pool"):
        GraphModelRunner(runner.model, runner.kv_cache, runner.block_manager, runner.device, capture=False)


def test_whether_a_target_runs_eagerly_for_its_features_is_decided_once_at_the_build(monkeypatch):
    """Issue 55: "eager when a drafter reads the target's features" was decided twice (the builder and
    the graph runner's bucket check). Now the builder decides: asked for captured layers it builds a
    plain ModelRunner even where graphs are on, and a graph runner refuses captured layers."""
    monkeypatch.setattr(minispec.build.engine, "use_cuda_graphs", lambda setting, device: True)
    padded = tiny_engine(TARGET)
    assert isinstance(padded.runner, GraphModelRunner)  # graphs on: the padded runner (eager off a GPU)
    config = EngineConfig(device="cpu", dtype="float32", num_kv_blocks=64, max_model_len=256)
    captured = minispec.build.engine.build_engine(config, model=TARGET, capture_layers=(0,))
    assert type(captured.runner).__name__ == "ModelRunner" and captured.runner.capture_layers == (0,)
    runner = captured.runner
    with pytest.raises(ValueError, match=r"capture_layers=\[0\]: a graph runner returns no captured layers"):
        GraphModelRunner(runner.model, runner.kv_cache, runner.block_manager, runner.device, capture=False,
                         capture_layers=(0,))


def prompts():
    g = torch.Generator().manual_seed(7)
    out = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 3, 12)]
    out[1] = out[1][:8] * 2 + [1]  # repeats, so n-gram lookup finds drafts
    return out


def generate(engine, max_tokens=24):
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
           for p in prompts()]
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.output_token_ids
    assert engine.block_manager.num_used_blocks == 0
    return [done[i] for i in ids]


SPECS = {
    "off": (SpecConfig(), None),
    "ngram": (SpecConfig(method="ngram", num_speculative_tokens=3), None),
    "draft chain": (SpecConfig(method="draft", num_speculative_tokens=3), DRAFT),
    "draft tree": (SpecConfig(method="draft", num_speculative_tokens=3, draft_topk=2, num_draft_tokens=5), DRAFT),
    "self-draft tree": (SpecConfig(method="draft", num_speculative_tokens=3, draft_topk=2, num_draft_tokens=5), TARGET),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_padded_graph_steps_give_the_eager_tokens(monkeypatch, name):
    """Greedy output through the padded graph buffers equals the eager runner's and plain
    decoding's, with prefix caching on, for every drafter; the graph path served steps, and the
    pad block's padding rows left every request's K/V alone."""
    spec, draft = SPECS[name]
    plain = generate(tiny_engine(TARGET))
    eager = generate(tiny_engine(TARGET, spec=spec, draft=draft))
    monkeypatch.setattr(minispec.build.engine, "use_cuda_graphs", lambda setting, device: True)
    engine = tiny_engine(TARGET, spec=spec, draft=draft)
    runner = engine.runner
    assert isinstance(runner, GraphModelRunner) and not runner.capture
    padded = generate(engine)
    assert padded == eager == plain
    assert runner.num_replays > 0
    if draft is not None:
        assert engine.drafter.inner.runner.num_replays > 0  # the draft's per-depth steps too


def test_padding_rows_write_only_the_pad_block(monkeypatch):
    """A step of 3 decodes pads to 4 rows: the pad row writes the pad block alone (the pool's K/V
    are the ones an unpadded step writes, to float32 rounding: a product of 4 rows may round
    differently from one of 3, where a pad row's write would change a value outright)."""
    eager = tiny_engine(TARGET)
    monkeypatch.setattr(minispec.build.engine, "use_cuda_graphs", lambda setting, device: True)
    padded = tiny_engine(TARGET)
    for engine in (padded, eager):
        for p in prompts()[:3]:
            engine.add_request(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        for _ in range(3):
            engine.step()
    used, pad = eager.block_manager.num_blocks_touched, padded.executor.runner.pad_block
    assert padded.executor.runner.num_replays > 0 and padded.block_manager.num_blocks_touched == used
    torch.testing.assert_close(padded.executor.runner.kv_cache.k[:, :used], eager.executor.runner.kv_cache.k[:, :used],
                               rtol=0, atol=1e-5)
    assert padded.executor.runner.kv_cache.k[:, pad].abs().sum() > 0  # the pad row wrote there


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (bench/gpu/gpu_run.py runs this on a GPU)")
def test_recorded_graphs_give_the_eager_tokens_on_cuda():
    def engine(graphs, spec=SpecConfig(), draft=None):
        config = EngineConfig(model="tiny", device="cuda", dtype="float32", num_kv_blocks=64, block_size=4,
                              max_model_len=128, cuda_graphs=graphs, spec=spec)
        return minispec.build.engine.build_engine(config, model=LlamaModel.random(tiny_config(), seed=3), draft=draft)

    base = generate(engine(False))
    assert generate(engine(True)) == base
    assert generate(engine(True, SPECS["draft tree"][0], LlamaModel.random(tiny_config(num_layers=1), seed=4))) == base


@pytest.mark.parametrize("qlen", [1, 5])
def test_attention_per_kv_head_equals_sdpa_with_gqa(qlen):
    """The GPU's grouped-query attention (query heads of one KV head as extra query rows, the mask
    repeated per step) equals SDPA's own enable_gqa, causal and tree masks alike."""
    from minispec.core.attention import AttentionGroup
    from minispec.base.gpu_attention import attention_per_kv_head
    g = torch.Generator().manual_seed(0)
    b, h, hkv, d, s = 3, 8, 2, 16, 32
    q = torch.randn(b, qlen, h, d, generator=g).transpose(1, 2)  # [B, H, Q, D], strided as in paged_attention
    k, v = torch.randn(b, hkv, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
    allowed = torch.rand(b, 1, qlen, s, generator=g) < 0.6
    allowed[..., 0] = True
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, float("-inf"))
    group = AttentionGroup(torch.zeros(b, qlen, dtype=torch.long), torch.zeros(b, 1, dtype=torch.long), mask)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.25, enable_gqa=True)
    torch.testing.assert_close(attention_per_kv_head(q, k, v, group, 0.25), want, rtol=1e-5, atol=1e-6)
    assert group.grouped_mask.shape == (b, 1, 4 * qlen, s)
