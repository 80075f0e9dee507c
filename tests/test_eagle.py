"""The EAGLE draft head (models/eagle.py, drafting in speculation/eagle.py) and its training (train/distill_eagle.py).

Speculation with the head is exact: greedy output equals plain decoding token for token under
chunked prefill, preemption and every k; sampled output keeps the target's law (chi-square,
false-failure odds 1e-4). The training unroll computes exactly what drafting computes, and a
short training run raises the head's agreement with the target.
"""

import pytest
import torch

from minispec.base.config import SpecConfig
from minispec.core.model_runner import ForwardItem, ModelRunner
from minispec.core.block_manager import BlockManager
from minispec.base.kv_cache import KVCache
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.train.distill import generate_data
from minispec.train.distill_eagle import add_features, eagle_batch, eagle_loss, evaluate_eagle, unroll
from minispec.models.eagle import build_eagle
from minispec.speculation.eagle import EagleDrafter

from conftest import tiny_config
from test_spec_exactness import P_FAIL, chi2_pvalue, exact_joint, run

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

TARGET = LlamaModel.random(tiny_config(), seed=0)
EVEN_IDS = torch.arange(0, TARGET.cfg.vocab_size, 2)  # a draft vocabulary of half the target's tokens


def head(seed: int = 1, scale: float = 0.02, feature_layers: tuple[int, ...] = ()):
    """An EAGLE head for TARGET, nudged off its initial weights so that it is not a special case;
    with ``feature_layers`` a multi-layer (EAGLE-3 style) head whose fc3 is nudged too."""
    h = build_eagle(TARGET, EVEN_IDS, feature_layers=feature_layers)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (h.fc, h.layers[0].qkv_proj, h.layers[0].gate_up_proj):
            p.add_(scale * torch.randn(p.shape, generator=g))
        if feature_layers:
            h.fc3.add_(5 * scale * torch.randn(h.fc3.shape, generator=g))
    return h.eval().requires_grad_(False), None, EVEN_IDS


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("sched", [{}, dict(max_num_batched_tokens=8), dict(num_kv_blocks=36)],
                         ids=["plain", "chunked-prefill", "preemption"])
def test_greedy_with_eagle_equals_plain(k, sched):
    prompts = [[1, 2, 3], [7, 7, 7, 7, 9], list(range(20, 60)), [5] * 17]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain, _, _ = run(TARGET, prompts, params, **sched)
    fast, engine, ids = run(TARGET, prompts, params, SpecConfig(method="draft", num_speculative_tokens=k),
                            head(), **sched)
    assert fast == plain
    assert isinstance(engine.drafter.inner, EagleDrafter)
    assert sum(engine.requests[i].num_draft_accepted for i in ids) > 0
    assert not engine.drafter.inner.progress.num_cached  # every request's head state was dropped at the end
    store = engine.drafter.inner.features  # the channel the head declared: target features by slot
    assert store.tensor.shape[-1] == TARGET.cfg.hidden_size and store.block_manager is engine.block_manager


@pytest.mark.parametrize("drafter", ["eagle", "draft-model"])
def test_confidence_threshold_drafts_fewer_likelier_tokens_and_keeps_greedy_output(drafter):
    """With draft_confidence_threshold a request stops drafting where the draft is unsure: fewer
    tokens are proposed, more of them are accepted, and greedy output is still plain decoding's."""
    from test_spec_exactness import NOISY_DRAFT, TARGET_MODEL

    target, draft, threshold = (TARGET, head(), 0.03) if drafter == "eagle" else (TARGET_MODEL, NOISY_DRAFT, 0.015)
    prompts = [[1, 2, 3], [7, 7, 7, 7, 9], list(range(20, 60)), [5] * 17]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain, _, _ = run(target, prompts, params)
    counts = []
    for thr in (0.0, threshold):
        out, engine, ids = run(target, prompts, params,
                               SpecConfig(method="draft", num_speculative_tokens=4, draft_confidence_threshold=thr),
                               draft)
        assert out == plain
        reqs = [engine.requests[i] for i in ids]
        counts.append((sum(r.num_draft_proposed for r in reqs), sum(r.num_draft_accepted for r in reqs),
                       sum(r.num_verify_steps for r in reqs)))
    (all_k, accepted_all, steps_all), (fewer, accepted_fewer, steps_fewer) = counts
    # the threshold cut some drafts, not all: fewer in all and fewer per verify step
    assert 0 < fewer < all_k and fewer / steps_fewer < all_k / steps_all
    assert accepted_fewer / fewer > accepted_all / all_k  # the drafts it kept were likelier


@pytest.mark.parametrize("sched", [{}, dict(max_num_batched_tokens=8), dict(num_kv_blocks=36)],
                         ids=["plain", "chunked-prefill", "preemption"])
def test_greedy_with_multi_layer_head_equals_plain(sched):
    """A head that reads a lower target layer besides the final state (EAGLE-3 style): the engine's
    target runner captures that layer, the drafter keeps the wide features, and greedy output is
    still plain decoding's."""
    prompts = [[1, 2, 3], [7, 7, 7, 7, 9], list(range(20, 60)), [5] * 17]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain, _, _ = run(TARGET, prompts, params, **sched)
    fast, engine, ids = run(TARGET, prompts, params, SpecConfig(method="draft", num_speculative_tokens=3),
                            head(feature_layers=(0,)), **sched)
    assert fast == plain
    assert engine.runner.capture_layers == (0,)
    assert sum(engine.requests[i].num_draft_accepted for i in ids) > 0
    # without the capture the head cannot read the target: a plain engine's runner captures nothing
    _, plain_engine, _ = run(TARGET, prompts[:1], params, SpecConfig(method="draft", num_speculative_tokens=3), head())
    assert plain_engine.runner.capture_layers == ()


@pytest.mark.parametrize("feature_layers", [(), (0,)], ids=["last-state", "multi-layer"])
def test_eagle_sampling_keeps_target_distribution(feature_layers):
    n, prompt = 3000, [1, 2, 3, 4]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=6, seed=s, ignore_eos=True) for s in range(n)]
    sched = dict(num_kv_blocks=2 * n + 8, max_model_len=8, max_num_seqs=n, max_num_batched_tokens=8 * n)
    outs, engine, ids = run(TARGET, [prompt] * n, params, SpecConfig(method="draft", num_speculative_tokens=1),
                            head(feature_layers=feature_layers), **sched)
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    assert 0.02 * n < accepted < 0.98 * n  # both acceptance and rejection paths ran
    joint = exact_joint(TARGET, prompt, params[0])
    cells = sorted(joint)
    observed = torch.tensor([sum(tuple(o[:2]) == c for o in outs) for c in cells], dtype=torch.float64)
    assert observed.sum() == n
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64) * n
    assert chi2_pvalue(observed, expected) > P_FAIL


@pytest.mark.parametrize("feature_layers", [(), (0,)], ids=["last-state", "multi-layer"])
def test_training_unroll_matches_drafting(feature_layers):
    """Unroll step s at position i computes what the s-th draft step computes after true position
    i - s + 1, through the paged cache: same features to float32 rounding."""
    model = head(seed=3, scale=0.1, feature_layers=feature_layers)[0]
    tokens = torch.randint(0, TARGET.cfg.vocab_size, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        feats = TARGET.hidden_dense(tokens, feature_layers)                          # [1, 30, F]
        next_ids = torch.cat([tokens[:, 1:], tokens[:, -1:]], dim=1)
        outs = unroll(model, next_ids, feats, 3)
    cfg = model.cfg
    for m in (5, 17):
        runner = ModelRunner(model, KVCache(1, 8, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32, torch.device("cpu")),
                             BlockManager(8, 16), torch.device("cpu"))
        runner.block_manager.allocate("r", m + 4)
        hidden = runner.forward([ForwardItem("r", tokens[0, 1: m + 2].tolist(), 0, 1)],
                                target_features=feats[0, : m + 1]).hidden
        feature = hidden[0][-1:]
        torch.testing.assert_close(feature, outs[0][0, m: m + 1], rtol=1e-4, atol=1e-5)
        for s in (2, 3):
            pos = m + s - 1
            hidden = runner.forward([ForwardItem("r", [int(tokens[0, pos + 1])], pos, 1)], features=feature).hidden
            feature = hidden[0]
            torch.testing.assert_close(feature, outs[s - 1][0, pos: pos + 1], rtol=1e-4, atol=1e-5)


def test_short_training_raises_agreement():
    """Twenty steps on the target's own greedy continuations lift the head's top-1 agreement."""
    g = torch.Generator().manual_seed(0)
    records = []
    with torch.no_grad():
        for _ in range(8):
            seq = torch.randint(0, TARGET.cfg.vocab_size, (1, 6), generator=g)
            for _ in range(16):  # the target's greedy continuation
                seq = torch.cat([seq, TARGET.forward_dense(seq)[:, -1:].argmax(-1)], dim=1)
            logp = torch.log_softmax(TARGET.forward_dense(seq)[0, 5:-1], dim=-1).topk(8)
            records.append({"prompt_ids": seq[0, :6].tolist(), "output_ids": seq[0, 6:].tolist(),
                            "topk_ids": logp.indices.int(), "topk_logprobs": logp.values.half()})
    add_features(TARGET, records, None)
    to_draft = torch.full((TARGET.cfg.vocab_size,), -1, dtype=torch.long)
    to_draft[EVEN_IDS] = torch.arange(len(EVEN_IDS))
    model = build_eagle(TARGET, EVEN_IDS)
    params = [p for name, p in model.named_parameters() if name not in ("embed_tokens", "lm_head")]
    for p in params:
        p.requires_grad_(True)
    before = evaluate_eagle(model, records, to_draft, 4096, 2)
    opt = torch.optim.Adam(params, lr=3e-3)
    for _ in range(20):
        loss, _ = eagle_loss(model, eagle_batch(records, list(range(8)), to_draft), 1.0, 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = evaluate_eagle(model, records, to_draft, 4096, 2)
    assert after[0] > before[0] + 0.1 and after[1] > before[1]


@pytest.mark.parametrize("capture", [(), (0,)], ids=["last-state", "multi-layer"])
def test_generated_data_records_the_target_features(tmp_path, capture):
    """generate_data keeps the target's features of every fed token (with ``capture_layers``, those
    layers' outputs too): what a teacher-forced pass computes, so the training labels are what
    the engine hands the drafter."""
    prompts = [[1, 2, 3, 4, 5], list(range(30, 50))]
    records = generate_data(TARGET, None, None, prompts, tmp_path, max_tokens=6, num_sampled=1, temperature=0.8,
                            seed=0, chunk=3, capture_layers=capture)
    assert len(records) == 3
    for r in records:
        seq = torch.tensor([r["prompt_ids"] + r["output_ids"]])
        with torch.no_grad():
            dense = TARGET.hidden_dense(seq, capture)[0, :-1]
        assert dense.shape[-1] == (len(capture) + 1) * TARGET.cfg.hidden_size
        assert r["features"].shape == dense.shape
        torch.testing.assert_close(r["features"].float(), dense, rtol=2e-2, atol=2e-2)


def test_multi_layer_head_starts_as_the_last_state_head():
    """fc3 starts as [0; I]: a multi-layer head built from the same weights as a last-state head
    drafts exactly what that head drafts, so a trained head can be continued with more layers
    (train/command.py ``--init-from`` with ``--feature-layers``); once fc3 moves, the lower layer
    changes the drafts."""
    last = head(seed=4)[0]
    multi = build_eagle(TARGET, EVEN_IDS, feature_layers=(0,))
    multi.load_state_dict(last.state_dict(), strict=False)
    tokens = torch.randint(0, TARGET.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        wide = TARGET.hidden_dense(tokens, (0,))
        e = TARGET.cfg.hidden_size
        torch.testing.assert_close(wide[..., -e:], TARGET.hidden_dense(tokens))  # the final state comes last
        same = multi.forward_dense(tokens, wide)
        torch.testing.assert_close(same, last.forward_dense(tokens, wide[..., -e:]))
        multi.fc3[:e].add_(0.5)  # read the lower layer
        assert not torch.allclose(multi.forward_dense(tokens, wide), same)


def test_feature_layers_and_widths_are_checked():
    """A layer the target lacks, its last layer (always read), a repeated id, or features of the
    wrong width are refused, naming the value and what is allowed."""
    for bad in ((1,), (0, 0), (-1,), (5,)):
        with pytest.raises(ValueError, match=r"feature layers .*must be increasing target layer ids in 0\.\.0"):
            build_eagle(TARGET, EVEN_IDS, feature_layers=bad)
    model = head(feature_layers=(0,))[0]
    e = TARGET.cfg.hidden_size
    with pytest.raises(ValueError, match=f"width {e}: this head reads {2 * e}"):
        model.project(torch.zeros(3, e))
    with pytest.raises(ValueError, match="either the target's features or its own"):
        model(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), None)
    cfg = TARGET.cfg
    with pytest.raises(ValueError, match=r"capture layers \[2\]: the model has layers 0\.\.1"):
        ModelRunner(TARGET, KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                                    torch.device("cpu")), BlockManager(4, 16), torch.device("cpu"), capture_layers=(2,))


def test_paged_capture_equals_dense_features():
    """The features the engine's target runner returns with capture_layers (paged cache, chunked)
    equal the teacher-forced pass's: what the head reads when serving is what it trained on."""
    cfg = TARGET.cfg
    tokens = torch.randint(0, cfg.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        dense = TARGET.hidden_dense(tokens, (0,))[0]
    runner = ModelRunner(TARGET, KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32,
                                         torch.device("cpu")), BlockManager(4, 16), torch.device("cpu"),
                         capture_layers=(0,))
    runner.block_manager.allocate("r", 20)
    first = runner.forward([ForwardItem("r", tokens[0, :12].tolist(), 0, 1)])
    second = runner.forward([ForwardItem("r", tokens[0, 12:].tolist(), 12, 1)])
    paged = torch.cat(first.features + second.features)
    torch.testing.assert_close(paged, dense, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(first.hidden + second.hidden), dense[:, -cfg.hidden_size:])
