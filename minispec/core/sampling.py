"""Turn logits into a next token: greedy, or temperature / top-k / top-p then a seeded draw.

Invariant: the same processing (temperature, then top-k, then top-p) is applied to draft and
target logits, so speculative sampling compares like with like (Leviathan et al. 2023, sec. 3.1).
Every random number of a request is keyed by (its seed, the output position it decides, its
purpose), never drawn from a stream other steps advance (``SeededDraws``).
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.request import SamplingParams

# the purposes a request draws for, one key each: the target's token (a plain sample, a residual or
# a bonus), the accept test of a draft token, and a sampling draft model's own draw
TARGET_DRAW, ACCEPT_DRAW, DRAFT_DRAW = 0, 1, 2
_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser (Steele et al. 2014): a 64-bit integer -> a well-spread 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def keyed_uniform(seed: int, position: int, purpose: int, branch: int = 0) -> float:
    """One uniform number in (0, 1] (53 random bits) for a key: a pure function, so no other
    draw can shift it. Args: seed: the request's (any integer); position: the output position
    the draw decides; purpose: TARGET_DRAW, ACCEPT_DRAW or DRAFT_DRAW; branch: a draft tree's j-th
    child (0 is a chain's key, so a tree of one child per node draws a chain's numbers)."""
    h = _mix64(_mix64(_mix64(seed & _MASK64) ^ position) ^ purpose)
    if branch:
        h = _mix64(h ^ branch)
    return ((h >> 11) + 1) / float(1 << 53)


class SeededDraws:
    """A request's random numbers from output position ``start`` on.

    Reproducible: a seeded request's text depends only on the model, its prompt, its parameters
    and the k of each verify step, never on its neighbours, a retried step, or the order requests
    are computed in. When k changes, a verify still decides each position from that position's
    own numbers; a shorter block accepted whole draws its bonus where a longer block tests a
    draft: from there the text may differ, but it keeps the target's distribution.
    """

    def __init__(self, seed: int, start: int = 0):
        self.seed = seed
        self.start = start

    def at(self, offset: int) -> "SeededDraws":
        """The same request's draws from output position ``start + offset`` on."""
        return SeededDraws(self.seed, self.start + offset)

    def uniform(self, i: int, purpose: int = ACCEPT_DRAW, branch: int = 0) -> float:
        """The uniform number in (0, 1] of position ``start + i`` (``branch``: see keyed_uniform)."""
        return keyed_uniform(self.seed, self.start + i, purpose, branch)

    def sample(self, probs: torch.Tensor, i: int, purpose: int = TARGET_DRAW, branch: int = 0) -> int:
        """One token from ``probs`` [V] (need not sum to 1) for position ``start + i``, by inverting
        its CDF at that position's uniform number (float64, so no kept token is skipped)."""
        cdf = probs.to("cpu", torch.float64).cumsum(-1)  # on the CPU, whatever device scored it
        x = torch.tensor([self.uniform(i, purpose, branch) * float(cdf[-1])], dtype=torch.float64)
        return min(int(torch.searchsorted(cdf, x)), probs.shape[-1] - 1)


class GeneratorDraws:
    """Draws in order from one ``torch.Generator`` (None: torch's global one): notebook 04's."""

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def at(self, offset: int) -> "GeneratorDraws":
        return self

    def uniform(self, i: int, purpose: int = ACCEPT_DRAW, branch: int = 0) -> float:
        return 1.0 - float(torch.rand(1, generator=self.generator))  # in (0, 1], as keyed_uniform

    def sample(self, probs: torch.Tensor, i: int, purpose: int = TARGET_DRAW, branch: int = 0) -> int:
        return int(torch.multinomial(probs.to("cpu", torch.float32), 1, generator=self.generator))


def as_draws(source) -> SeededDraws | GeneratorDraws:
    """SeededDraws or GeneratorDraws as given; a torch.Generator or None becomes GeneratorDraws."""
    return source if isinstance(source, (SeededDraws, GeneratorDraws)) else GeneratorDraws(source)


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (Holtzman et al. 2020, section 3.1).

    Args: logits: [M, V] float32 for one request; params: temperature > 0 (greedy: :func:`greedy`).
    Returns: [M, V] float32 rows summing to 1, zero outside the kept set. Where the distribution
    collapses the result is the greedy choice, never NaN: a temperature so small that logits / T
    overflows is applied as (logits - max) / T; a top_p float32 rounds to 0 keeps the top token.
    """
    scaled = logits.float() / params.temperature
    if scaled.isnan().any() or scaled.isposinf().any():  # 1 / T overflowed: shift first, then scale
        logits = logits.float()
        temperature = max(params.temperature, torch.finfo(torch.float32).tiny)  # float32 would round it to 0
        scaled = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    logits = scaled
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p; the first token always stays
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop_sorted[..., 0] = False  # a top_p float32 rounds to 0 would drop it too (0 >= 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, draws, purpose: int = TARGET_DRAW) -> torch.Tensor:
    """One draw per row from probs [M, V] -> [M] long; row m decides output position
    ``draws.start + m`` (``draws``: SeededDraws, or a torch.Generator / None drawn in order)."""
    if not isinstance(draws, SeededDraws):  # a generator: one vectorised draw, in order
        return torch.multinomial(probs.cpu(), 1, generator=as_draws(draws).generator).squeeze(-1)
    return torch.tensor([draws.sample(row, m, purpose) for m, row in enumerate(probs)], dtype=torch.long)


def next_tokens(logits: torch.Tensor, params: SamplingParams, draws) -> torch.Tensor:
    """Greedy (the argmax) or sampled next token for each row of logits [M, V] -> [M] long."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample(logits_to_probs(logits, params), draws)
