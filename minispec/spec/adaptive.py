"""Adaptive speculation policies driven by a cost model and the live acceptance estimate.

- ``GoodputPolicy`` ("goodput"): each step, a k per request (0 = none) that maximises expected
  generated tokens per second, sum_i E(alpha_i, k_i) / T(k_1..k_B), with E the expected accepted
  length and T the cost model's step time (target forward plus the draft loop). In the spirit of
  SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language Models
  Using Goodput", sec. 4; their goodput is this token rate, not the SLO goodput of metrics.py).
- ``AutoThresholdPolicy`` ("auto"): a concurrency threshold with hysteresis, placed where the cost
  model says speculation stops paying: the largest batch whose expected speedup is >= 1.
Both read acceptance from the requests' own counters (``num_draft_accepted`` /
``num_draft_proposed``) through an ``AcceptanceEstimate``, so they work unchanged in the real
engine and in the simulator. Invariant: a policy only returns k values; the scheduler still clamps
them to budget, max_tokens and maximum length. Taught in notebooks/06_policies.ipynb.
"""

from __future__ import annotations

from minispec.request import Request
from minispec.sim.costmodel import CostModel, expected_accepted_length
from minispec.spec.policy import SpecPolicy, ThresholdPolicy

DEFAULT_PRIOR_ALPHA = 0.6  # acceptance assumed before any draft token was verified


class AcceptanceEstimate:
    """Live acceptance rate: an exponentially weighted pool over all requests, and per request a
    blend of its own counts with the pool (``prior_weight`` pseudo-proposals of the pool's rate).

    Args:
        prior: rate assumed before anything is observed, in [0, 1].
        prior_weight: pseudo-proposals the prior (pool) weighs in a blend.
        decay: per-step weight kept by past observations (0.99 ~ the last 100 steps).
    """

    def __init__(self, prior: float = DEFAULT_PRIOR_ALPHA, prior_weight: float = 8.0, decay: float = 0.99):
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior acceptance {prior!r}: must be in [0, 1]")
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.num_proposed = 0.0
        self.num_accepted = 0.0
        self._seen: dict[str, tuple[Request, int, int]] = {}
        self._steps = 0

    @property
    def alpha(self) -> float:
        """The pool's rate: accepted / proposed, pulled toward the prior while evidence is thin."""
        w = self.prior_weight
        return (self.num_accepted + self.prior * w) / (self.num_proposed + w)

    def observe(self, requests: list[Request]) -> None:
        """Add the draft tokens proposed and accepted since each request was last seen."""
        new_p = new_a = 0
        seen = self._seen
        for r in requests:
            p, a = r.num_draft_proposed, r.num_draft_accepted
            old = seen.get(r.request_id)
            if old is None or old[1] != p:
                new_p += p - (old[1] if old else 0)
                new_a += a - (old[2] if old else 0)
                seen[r.request_id] = (r, p, a)
        self.num_proposed = self.num_proposed * self.decay + new_p
        self.num_accepted = self.num_accepted * self.decay + new_a
        self._steps += 1
        if self._steps % 256 == 0:  # forget finished requests
            self._seen = {rid: v for rid, v in seen.items() if not v[0].finished}

    def for_request(self, r: Request, pool: float | None = None) -> float:
        """A request's own rate blended with the pool's (``pool`` passes a precomputed alpha)."""
        pool = self.alpha if pool is None else pool
        w = self.prior_weight
        return (r.num_draft_accepted + pool * w) / (r.num_draft_proposed + w)


def _prior(arg: str, name: str) -> float:
    if not arg:
        return DEFAULT_PRIOR_ALPHA
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"policy {name}:{arg}: the argument is the prior acceptance rate, a number in [0, 1] "
                         f"(e.g. {name}:0.7)")
    return value


class GoodputPolicy(SpecPolicy):
    """Per-request k maximising expected tokens per second (SmartSpec-style), up to ``k`` each.

    The search: every increment "request i from j to j + 1 drafts" gains alpha_i^(j+1) expected
    tokens; increments are taken in order of gain and the best prefix is kept, so uniform choices
    (everyone k = 0, 1, ..., K) are among the candidates and high-acceptance requests draft first.
    Prefill chunks sharing the step are not known to the policy and are left out of T.
    """

    name = "goodput"

    def __init__(self, k: int, cost_model: CostModel, estimate: AcceptanceEstimate | None = None):
        super().__init__(k)
        self.cost_model = cost_model
        self.estimate = estimate or AcceptanceEstimate()

    def decide(self, decodes: list[Request], num_running: int) -> dict[str, int]:
        if not decodes:
            return {}
        self.estimate.observe(decodes)
        pool = self.estimate.alpha
        alphas = [self.estimate.for_request(r, pool) for r in decodes]
        ks = self.plan([r.num_computed_tokens for r in decodes], alphas)
        return {r.request_id: kk for r, kk in zip(decodes, ks)}

    def plan(self, contexts: list[int], alphas: list[float]) -> list[int]:
        """k per request maximising sum E(alpha_i, k_i) / T for requests with ``contexts`` cached
        tokens. Returns a list of ints in 0..k."""
        cm, big_k, b = self.cost_model, self.k, len(contexts)
        window = cm.draft_kv_window
        n = r = b
        pairs = kv = float(sum(contexts) + b)
        target_s = cm.forward_time_s(n, r, pairs, kv, b)
        level_n = [0] * big_k
        level_pairs = [0.0] * big_k
        level_s = [0.0] * big_k
        draft_s = 0.0
        tokens = float(b)
        best_rate, best_len = tokens / target_s, 0
        order = sorted(((alphas[i] ** (j + 1), j, i) for i in range(b) for j in range(big_k) if alphas[i] > 0),
                       key=lambda t: (-t[0], t[1]))
        for step, (gain, j, i) in enumerate(order, 1):
            c = contexts[i]
            n += 1
            r += 1
            pairs += c + j + 2
            kv += 1
            target_s = cm.forward_time_s(n, r, pairs, kv, b)
            ctx = c + j if window is None else min(c + j, window)
            level_n[j] += 1
            level_pairs[j] += ctx + 1
            new_level = cm.forward_time_s(level_n[j], level_n[j], level_pairs[j], level_pairs[j], level_n[j],
                                          draft=True)
            draft_s += new_level - level_s[j]
            level_s[j] = new_level
            tokens += gain
            rate = tokens / (target_s + draft_s)
            if rate > best_rate:
                best_rate, best_len = rate, step
        ks = [0] * b
        for _, j, i in order[:best_len]:
            ks[i] = max(ks[i], j + 1)
        return ks

    def __repr__(self) -> str:
        return f"GoodputPolicy(k<={self.k}, {self.cost_model})"


class AutoThresholdPolicy(ThresholdPolicy):
    """Speculate with k while running requests <= the cost model's break-even batch size.

    The threshold is the largest batch n whose expected speedup E(alpha, k) T_plain(n) / T_spec(n)
    is >= 1 at the live acceptance rate and the decodes' mean context; it is recomputed when
    either moves, and ThresholdPolicy's hysteresis keeps a load near it from flapping.
    """

    name = "auto"

    def __init__(self, k: int, cost_model: CostModel, estimate: AcceptanceEstimate | None = None,
                 max_batch: int = 4096):
        super().__init__(k, threshold=max_batch)
        self.cost_model = cost_model
        self.estimate = estimate or AcceptanceEstimate()
        self.max_batch = max_batch
        self._key = None

    def decide(self, decodes, num_running):
        if decodes:
            self.estimate.observe(decodes)
            context = sum(r.num_computed_tokens for r in decodes) / len(decodes)
            key = (round(self.estimate.alpha, 2), round(context, -1 if context < 1000 else -2))
            if key != self._key:
                self._key = key
                self.threshold = self.break_even(self.estimate.alpha, context)
                self.margin = max(1, self.threshold // 4)
        return super().decide(decodes, num_running)

    def break_even(self, alpha: float, context: float) -> int:
        """Largest batch size (0..max_batch) at which speculation with k still pays (speedup >= 1)."""
        cm, k = self.cost_model, self.k
        if cm.speedup(1, context, k, alpha) < 1.0:
            return 0
        if cm.speedup(self.max_batch, context, k, alpha) >= 1.0:
            return self.max_batch
        lo, hi = 1, self.max_batch  # speedup(lo) >= 1 > speedup(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if cm.speedup(mid, context, k, alpha) >= 1.0:
                lo = mid
            else:
                hi = mid
        return lo

    def __repr__(self) -> str:
        return f"AutoThresholdPolicy(k={self.k}, threshold={self.threshold}, {self.cost_model})"


def make_adaptive_policy(name: str, k: int, arg: str, cost_model: CostModel | None) -> SpecPolicy:
    """Build "goodput" or "auto" (``arg``: optional prior acceptance rate, e.g. "goodput:0.7").

    Raises:
        ValueError: for another name, a bad prior, or no cost model (the real engine builds one
            from the profiled ``this`` hardware, see ``engine_cost_model``).
    """
    if cost_model is None:
        raise ValueError(f"policy {name!r} needs a cost model: the simulator passes its own; the real engine uses "
                         "data/hardware/this.json, written by `python -m minispec profile`")
    estimate = AcceptanceEstimate(prior=_prior(arg, name))
    if name == "goodput":
        return GoodputPolicy(k, cost_model, estimate)
    if name == "auto":
        return AutoThresholdPolicy(k, cost_model, estimate)
    raise ValueError(f"adaptive policy {name!r} is unknown: choose goodput or auto")


def engine_cost_model(target, dtype, draft=None, hardware: str = "this") -> CostModel:
    """The cost model the real engine's adaptive policies use: the live models' shapes on the
    profiled hardware. ``target`` / ``draft``: LlamaModel (or None: free drafting); dtype: torch dtype.

    Raises: ValueError when ``hardware`` is not profiled (run ``python -m minispec profile``).
    """
    from minispec.sim.hardware import load_hardware
    from minispec.sim.modelspec import ModelSpec

    name = str(dtype).removeprefix("torch.")
    hw = load_hardware(hardware)
    target_spec = ModelSpec.from_model_config(target.cfg, "target", name)
    draft_spec = ModelSpec.from_model_config(draft.cfg, "draft", name) if draft is not None else None
    return CostModel(hw, target_spec, draft_spec)
