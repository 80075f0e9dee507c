"""Temperature, top-k and top-p keep the right tokens, and draws follow the processed probabilities."""

import torch

from minispec.request import SamplingParams
from minispec.sampling import logits_to_probs, sample


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
