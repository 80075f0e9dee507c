"""Turn logits into a next token: greedy, or temperature / top-k / top-p then a seeded draw.

Invariant: the same processing (temperature, then top-k, then top-p) is applied to draft and
target logits, so speculative sampling compares like with like (Leviathan et al. 2023, section
3.1 note on sampling variants). Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.request import SamplingParams


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (Holtzman et al. 2020, section 3.1).

    Args:
        logits: [M, V] float32 for one request (M positions share its params).
        params: temperature must be > 0 here; greedy requests use :func:`greedy` instead.
    Returns: [M, V] float32 rows summing to 1, zero outside the kept set.
    """
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p; the first token always stays
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax token per row: logits [M, V] -> [M] long."""
    return logits.argmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row from probs [M, V] -> [M] long, using the request's generator."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Greedy or sampled next token for each row of logits [M, V] -> [M] long."""
    if params.greedy:
        return greedy(logits)
    return sample(logits_to_probs(logits, params), generator)
