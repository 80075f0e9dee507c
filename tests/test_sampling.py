"""Temperature, top-k and top-p keep the right tokens, and draws follow the processed probabilities."""

import pytest
import torch

from minispec.core.request import SamplingParams
from minispec.core.sampling import logits_to_probs, sample


def test_top_k_and_top_p_masks():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))   # 0.5 + 0.3 reaches 0.8
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.81))
    assert (p[0] > 0).tolist() == [True, True, True, False]
    p = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.1))
    assert p[0].tolist() == [1.0, 0.0, 0.0, 0.0]                       # the top token always stays


def test_temperature_sharpens():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    cold = logits_to_probs(logits, SamplingParams(temperature=0.5))
    hot = logits_to_probs(logits, SamplingParams(temperature=2.0))
    assert cold[0, 0] > torch.softmax(logits, -1)[0, 0] > hot[0, 0]


def test_sample_frequencies_match_probabilities():
    probs = torch.tensor([[0.1, 0.6, 0.3]]).repeat(20000, 1)
    draws = sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=3).float() / len(draws)
    # binomial standard error at n=20000 is <= 0.0035; 0.015 is over four of them
    assert torch.allclose(freq, torch.tensor([0.1, 0.6, 0.3]), atol=0.015)


def test_seeded_draws_are_keyed_by_seed_position_and_purpose():
    from minispec.core.sampling import ACCEPT_DRAW, DRAFT_DRAW, TARGET_DRAW, SeededDraws, keyed_uniform

    u = [keyed_uniform(7, pos, purpose) for pos in range(200) for purpose in (TARGET_DRAW, ACCEPT_DRAW, DRAFT_DRAW)]
    assert all(0.0 < x <= 1.0 for x in u) and len(set(u)) == len(u)
    assert keyed_uniform(7, 3, ACCEPT_DRAW) == keyed_uniform(7, 3, ACCEPT_DRAW) != keyed_uniform(8, 3, ACCEPT_DRAW)
    assert SeededDraws(7, start=3).uniform(0) == keyed_uniform(7, 3, ACCEPT_DRAW) == SeededDraws(7).uniform(3)
    assert SeededDraws(7, start=2).at(1).uniform(0) == SeededDraws(7, start=3).uniform(0)
    # seeds anywhere in the allowed range, negative ones included
    assert 0.0 < keyed_uniform(-2**63, 0, TARGET_DRAW) <= 1.0 and 0.0 < keyed_uniform(2**63 - 1, 0, 0) <= 1.0


def test_seeded_draws_sample_the_distribution():
    from minispec.core.sampling import SeededDraws

    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = [SeededDraws(seed).sample(probs, 0) for seed in range(20000)]
    freq = torch.bincount(torch.tensor(draws), minlength=4).float() / len(draws)
    # binomial standard error at n=20000 is <= 0.0035; 0.015 is over four of them
    assert freq[1] == 0 and torch.allclose(freq, probs, atol=0.015)


def test_seed_range_is_named():
    for bad in (2**64, -2**63 - 1, True, 1.5):
        with pytest.raises(ValueError, match=r"seed=.*-9223372036854775808 \.\. 9223372036854775807"):
            SamplingParams(seed=bad)
    SamplingParams(seed=2**63 - 1)
    SamplingParams(seed=-2**63)


def test_booleans_are_not_numbers():
    """Issue 15, fault 8 at the engine API: ``max_tokens=True`` was taken as 1 (bool is an int in Python)."""
    for field in ("max_tokens", "temperature", "top_k", "top_p", "min_tokens", "num_speculative_tokens"):
        with pytest.raises(ValueError, match=f"{field}=True"):
            SamplingParams(**{field: True})


# -- issue 26, class 4: parameters validation lets through give a distribution, never NaN -----------

COLLAPSING = [dict(temperature=1e-39), dict(temperature=1e-50), dict(temperature=5e-324, top_k=3),
              dict(temperature=1.0, top_p=1e-300), dict(temperature=1e-39, top_p=1e-300)]


@pytest.mark.parametrize("kwargs", COLLAPSING, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_a_collapsing_distribution_is_the_greedy_choice(kwargs):
    """logits / 1e-39 overflows float32 and a top_p of 1e-300 rounds to 0 there: both gave NaN rows
    (so every draw took the last vocabulary id); now all mass lands on the argmax."""
    logits = torch.randn(5, 256, generator=torch.Generator().manual_seed(0)) * 4
    logits[1, 7] = float("-inf")  # a token the draft's vocabulary lacks stays at 0
    probs = logits_to_probs(logits, SamplingParams(**kwargs))
    assert not probs.isnan().any()
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 256).float())


@pytest.mark.parametrize("kwargs", COLLAPSING[:1] + COLLAPSING[3:4], ids=["temperature=1e-39", "top_p=1e-300"])
@pytest.mark.parametrize("speculate", [False, True])
def test_a_collapsing_distribution_decodes_the_greedy_tokens_in_the_engine(kwargs, speculate):
    """With speculation off and on (a noisy draft model: drafts accepted and rejected), such a
    request emits what greedy decoding emits, never the last vocabulary id forever."""
    from conftest import tiny_engine
    from test_spec_exactness import NOISY_DRAFT, TARGET_MODEL
    from minispec.base.config import SpecConfig

    prompts = [[1, 2, 3, 4], [9, 8, 7]]

    def outputs(params):
        engine = tiny_engine(TARGET_MODEL, spec=SpecConfig(method="draft", num_speculative_tokens=3) if speculate
                             else None, draft=NOISY_DRAFT if speculate else None)
        ids = [engine.add_request(p, params) for p in prompts]
        outs = {o.request_id: o.output_token_ids for o in engine.run_until_done()}
        return [outs[i] for i in ids], engine

    greedy, _ = outputs(SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    sampled, engine = outputs(SamplingParams(max_tokens=16, ignore_eos=True, seed=1, **kwargs))
    assert sampled == greedy
    assert not speculate or sum(r.num_draft_proposed for r in engine.requests.values()) > 0
