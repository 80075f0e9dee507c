"""Acceptance models: how many of k draft tokens a verify accepts, drawn from alpha, per route, or
from a recorded trace, and the expected-length formulas that follow from alpha.

The synthetic drafter (core/drafters.py) and the simulator (sim/executor.py) draw from the same
models, so a seeded run accepts the same prefixes on both clocks. Each model returns the accepted
prefix length for one request's k drafts. With one alpha, position
j is accepted with probability alpha given that j - 1 was, so P(accepted >= j) = alpha^j and the
mean accepted length, bonus included, is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023,
eq. 1). A trace replays the per-position acceptance a real run recorded (``acceptance_by_position``
in request metrics). Vocabulary (kept apart everywhere): alpha is the per-position acceptance probability; the
acceptance rate is accepted / proposed draft tokens; the mean accepted length is tokens emitted
per verify step, bonus included. Invariant: 0 <= accepted <= k, drawn from the model's own
seeded generator. Plain arithmetic: no torch here.
Draft trees: a verify follows the one child whose token the target picks, so what matters at a
node is the chance that the target's token is among its c children: the top-c agreement a(c),
with a(1) = alpha. The models here use a(c) = 1 - (1 - alpha) c^(-beta): the shipped EAGLE head's
measured first-position agreements (top 1 0.519, top 2 0.648, top 4 0.741; data/draft/MODEL_CARD.md)
fit beta = 0.45 within 0.003. ``draw_tree`` walks a tree with that law (the target's token is
child j's with probability a(j + 1) - a(j)) over ``tree_shape.canonical_tree``, the shape the
simulator prices.
Taught in notebooks/04_speculative_decoding.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from minispec.base.tree_shape import tree_children, tree_depth


def expected_accepted_length(alpha: float, k: int) -> float:
    """Tokens one verify step emits on average, bonus included: (1 - alpha^(k+1)) / (1 - alpha)
    when each position is accepted with probability alpha (Leviathan et al. 2023, eq. 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def leviathan_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Expected walltime improvement at batch 1, (1 - alpha^(k+1)) / ((1 - alpha)(k c + 1)), with c
    the draft step's cost over the target step's (Leviathan et al. 2023, Theorem 3.8)."""
    return expected_accepted_length(alpha, k) / (k * cost_ratio + 1.0)


TOPK_BETA = 0.45  # top-c agreement exponent fitted to the shipped head (see the module doc)


def topk_agreement(alpha: float, c: int, beta: float = TOPK_BETA) -> float:
    """a(c): the chance the target's token is among a node's c most likely draft children, when
    the most likely one is accepted with probability alpha (c = 0 gives 0)."""
    if c <= 0:
        return 0.0
    return 1.0 - (1.0 - alpha) * c ** (-beta)


def expected_tree_length(alpha: float, parents: list[int], beta: float = TOPK_BETA) -> float:
    """Tokens one verify of a draft tree emits on average, the bonus or correction included, when
    the target's token is a node's j-th child with probability a(j + 1) - a(j) (module doc).
    A chain gives (1 - alpha^(k+1)) / (1 - alpha)."""
    children = tree_children(parents)

    def below(node: int) -> float:  # expected accepted drafts under ``node``
        total, prev = 0.0, 0.0
        for j, child in enumerate(children.get(node, ())):
            a = topk_agreement(alpha, j + 1, beta)
            total += (a - prev) * (1.0 + below(child))
            prev = a
        return total

    return 1.0 + below(-1)


def alpha_for_accepted_length(length: float, k: int, parents: list[int] | None = None) -> float:
    """The per-position alpha whose mean accepted length (bonus included) at k drafts is
    ``length``: the inverse of (1 - alpha^(k+1)) / (1 - alpha), or of :func:`expected_tree_length`
    for a draft tree given by ``parents``. Both rise monotonically with alpha, so bisection finds
    it to 1e-9. For a published mean accepted length at a known k (``simulate --acceptance-length``).

    Raises: ValueError when ``length`` is outside [1, k + 1] (what k drafts can emit).
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k={k!r}: must be an integer >= 1")
    depth = k if parents is None else tree_depth(parents)
    if not 1.0 <= length <= depth + 1:
        raise ValueError(f"mean accepted length {length}: must be in [1, {depth + 1}] with k={k} drafts "
                         f"(bonus token included)")
    mean = (lambda a: expected_accepted_length(a, k)) if parents is None else \
        (lambda a: expected_tree_length(a, parents))
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean(mid) < length else (lo, mid)
    return (lo + hi) / 2


def _tree_walk(parents: list[int], agreement, u) -> list[int]:
    """The accepted path of a tree when depth d's node with c children passes with probability
    agreement(d, c) and the target's token is child j's with agreement(d, j + 1) - agreement(d, j);
    ``u()`` gives uniform numbers."""
    children = tree_children(parents)
    node, path = -1, []
    while children.get(node):
        kids = children[node]
        x = u()
        chosen = next((c for j, c in enumerate(kids) if x < agreement(len(path), j + 1)), None)
        if chosen is None:
            break
        path.append(chosen)
        node = chosen
    return path


def _check_alpha(alpha: float, what: str = "alpha") -> float:
    if not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{what}={alpha!r}: must be a number in [0, 1]")
    return float(alpha)


class FixedAlpha:
    """Every position of every request is accepted with probability ``alpha``."""

    def __init__(self, alpha: float, seed: int = 0):
        self.alpha = _check_alpha(alpha)
        self.rng = random.Random(seed)
        self._log_alpha = math.log(self.alpha) if 0.0 < self.alpha < 1.0 else None

    def draw(self, request, k: int) -> int:
        """Accepted prefix length in 0..k. One uniform u gives floor(log u / log alpha), whose
        tail P(>= j) = alpha^j is that of a run of Bernoulli(alpha) successes."""
        if self._log_alpha is None:
            return k if self.alpha >= 1.0 else 0
        u = 1.0 - self.rng.random()  # in (0, 1]
        return min(k, int(math.log(u) / self._log_alpha))

    def draw_tree(self, request, parents: list[int]) -> list[int]:
        """The accepted path (node indices, root first) of a draft tree (see the module doc)."""
        return _tree_walk(parents, lambda d, c: topk_agreement(self.alpha, c), self.rng.random)


class RouteAlpha:
    """A different alpha per route (chat, json, ...). Simulated prompts carry their route's index
    in every token id (see ``minispec.sim.sweep.route_prompts``), so the route is read from the
    request's first prompt token.

    Args:
        alphas: route name -> alpha, in route-index order.
    """

    def __init__(self, alphas: dict[str, float], seed: int = 0):
        if not alphas:
            raise ValueError("routes: give at least one route=alpha pair, e.g. chat=0.8,json=0.3")
        self.routes = list(alphas)
        self.by_index = [FixedAlpha(_check_alpha(a, f"alpha of route {name!r}"), seed + i)
                         for i, (name, a) in enumerate(alphas.items())]

    def draw(self, request, k: int) -> int:
        return self._route(request).draw(request, k)

    def draw_tree(self, request, parents: list[int]) -> list[int]:
        return self._route(request).draw_tree(request, parents)

    def _route(self, request) -> FixedAlpha:
        route = request.prompt_token_ids[0]
        if not 0 <= route < len(self.by_index):
            raise ValueError(f"request {request.request_id}: route index {route} is not one of "
                             f"0..{len(self.by_index) - 1} ({', '.join(self.routes)})")
        return self.by_index[route]


class TraceAcceptance:
    """Replays a real run's per-position acceptance: rates[j] = P(accepted > j), the fraction of
    verify steps that accepted draft position j (what ``acceptance_by_position`` records).

    Past the trace's last position the conditional rate of the last position is assumed to hold.
    """

    def __init__(self, rates: list[float], seed: int = 0):
        if not rates:
            raise ValueError("acceptance trace is empty: it needs at least one position's rate")
        clean, prev = [], 1.0
        for j, r in enumerate(rates):
            r = _check_alpha(r, f"acceptance rate of position {j}")
            prev = min(prev, r)  # a prefix can only shrink
            clean.append(prev)
        self.rates = clean
        self.rng = random.Random(seed)

    def rate(self, j: int) -> float:
        """P(accepted > j) for any position j >= 0."""
        if j < len(self.rates):
            return self.rates[j]
        last = self.rates[-1]
        before = self.rates[-2] if len(self.rates) > 1 else 1.0
        cond = last / before if before > 0 else 0.0
        return last * cond ** (j - len(self.rates) + 1)

    def draw(self, request, k: int) -> int:
        u = self.rng.random()
        accepted = 0
        while accepted < k and u < self.rate(accepted):
            accepted += 1
        return accepted

    def draw_tree(self, request, parents: list[int]) -> list[int]:
        """A tree's accepted path: depth d's top-1 acceptance is the trace's conditional rate
        there, the other children add top-c agreement as in the module doc."""
        def agreement(d: int, c: int) -> float:
            before = self.rate(d - 1) if d > 0 else 1.0
            alpha = self.rate(d) / before if before > 0 else 0.0
            return topk_agreement(alpha, c)

        return _tree_walk(parents, agreement, self.rng.random)


def load_trace(path: str | Path, seed: int = 0) -> TraceAcceptance:
    """A TraceAcceptance from JSON: {"acceptance_by_position": [...]}, a plain list of rates, or a
    list of request-metric dicts (each with ``acceptance_by_position`` and ``num_draft_proposed``).

    Raises: ValueError for a missing file or a shape other than these.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"acceptance trace {str(path)!r} not found")
    data = json.loads(path.read_text())
    if isinstance(data, dict) and "acceptance_by_position" in data:
        return TraceAcceptance(list(data["acceptance_by_position"]), seed)
    if isinstance(data, list) and data and all(isinstance(x, (int, float)) for x in data):
        return TraceAcceptance([float(x) for x in data], seed)
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        sums: list[float] = []
        weights: list[float] = []
        for m in data:
            w = m.get("num_draft_proposed") or 1
            for j, rate in enumerate(m.get("acceptance_by_position") or []):
                if j == len(sums):
                    sums.append(0.0)
                    weights.append(0.0)
                sums[j] += rate * w
                weights[j] += w
        if sums:
            return TraceAcceptance([s / w for s, w in zip(sums, weights)], seed)
    raise ValueError(f"{path}: expected {{'acceptance_by_position': [...]}}, a list of rates, or a list of "
                     "request metrics with 'acceptance_by_position'")


def parse_routes(text: str) -> tuple[dict[str, float], list[str]]:
    """"chat=0.8:3,json=0.3:1" -> ({"chat": 0.8, "json": 0.3}, a route list mixing 3 chat : 1 json).

    The weight after ":" is optional (1). Raises ValueError for a malformed part.
    """
    alphas: dict[str, float] = {}
    mix: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            name, _, rest = part.partition("=")
            alpha_text, _, weight_text = rest.partition(":")
            alpha, weight = float(alpha_text), int(weight_text or 1)
        except ValueError:
            raise ValueError(f"route {part!r}: write NAME=ALPHA or NAME=ALPHA:WEIGHT, "
                             "e.g. chat=0.8:3") from None
        if not name or weight < 1:
            raise ValueError(f"route {part!r}: needs a name and a weight >= 1")
        alphas[name] = _check_alpha(alpha, f"alpha of route {name!r}")
        mix += [name] * weight
    if not alphas:
        raise ValueError(f"routes {text!r}: give at least one NAME=ALPHA")
    return alphas, mix
