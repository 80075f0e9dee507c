"""The live acceptance estimate and the probe: what an adaptive policy knows about acceptance.

``AcceptanceEstimate`` estimates alpha (the per-position acceptance probability) from the
requests' own counters (``num_draft_proposed``, ``num_draft_accepted``): the same numbers in the
real engine and in the simulator. A policy that turned speculation off would never see
acceptance again, so ``Probe`` lets a few requests draft now and then while it says no: on one
step in ``every`` of those that leave requests without drafts, a bounded share of the steps that
keeps the estimate honest and lets speculation come back on where acceptance is high.
Invariant: the estimate counts each verify once, as a run of accepts up to the first rejection.
Used by the adaptive policies (speculation/adaptive.py); taught in notebooks/08_json_routes.ipynb.
"""

from __future__ import annotations

from minispec.base.checks import is_int
from minispec.core.request import Request

DEFAULT_PRIOR_ALPHA = 0.6  # alpha assumed before any draft token was verified


class AcceptanceEstimate:
    """Live per-position acceptance alpha, estimated from the requests' draft counters.

    A verify that proposed k and accepted a is a run of a successes, then one failure when a < k,
    so alpha's estimate is accepted / (accepted + failures), not accepted / proposed (that
    acceptance rate is (E - 1) / k, lower than alpha whenever k > 1). The pool over all requests
    is exponentially weighted; a request's own estimate blends its counts with the pool's
    (``prior_weight`` pseudo-trials of the pool's alpha).

    Args:
        prior: alpha assumed before anything is observed, in [0, 1].
        prior_weight: pseudo-trials the prior (pool) weighs in a blend.
        decay: per-step weight kept by past observations (0.99 ~ the last 100 steps).
    """

    def __init__(self, prior: float = DEFAULT_PRIOR_ALPHA, prior_weight: float = 8.0, decay: float = 0.99):
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"prior alpha {prior!r}: must be in [0, 1]")
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.num_trials = 0.0
        self.num_accepted = 0.0
        # request id -> [request, proposed seen, accepted seen, own trials, own accepted]
        self._seen: dict[str, list] = {}
        self._steps = 0

    @property
    def alpha(self) -> float:
        """The pool's alpha, pulled toward the prior while evidence is thin."""
        w = self.prior_weight
        return (self.num_accepted + self.prior * w) / (self.num_trials + w)

    def observe(self, requests: list[Request]) -> None:
        """Count the verifies each request ran since it was last seen (one per step it decoded)."""
        new_t = new_a = 0
        seen = self._seen
        for r in requests:
            p, a = r.num_draft_proposed, r.num_draft_accepted
            row = seen.get(r.request_id)
            if row is None:
                row = seen[r.request_id] = [r, 0, 0, 0, 0]
            dp, da = p - row[1], a - row[2]
            if dp > 0:
                trials = da + (da < dp)
                new_t += trials
                new_a += da
                row[1], row[2], row[3], row[4] = p, a, row[3] + trials, row[4] + da
        self.num_trials = self.num_trials * self.decay + new_t
        self.num_accepted = self.num_accepted * self.decay + new_a
        self._steps += 1
        if self._steps % 256 == 0:  # forget finished requests
            self._seen = {rid: row for rid, row in seen.items() if not row[0].finished}

    def for_request(self, r: Request, pool: float | None = None) -> float:
        """A request's own alpha blended with the pool's (``pool`` passes a precomputed alpha)."""
        pool = self.alpha if pool is None else pool
        row = self._seen.get(r.request_id)
        trials, accepted = (row[3], row[4]) if row else (0, 0)
        w = self.prior_weight
        return (accepted + pool * w) / (trials + w)


class Probe:
    """Speculation now and then while a policy says no, so that the acceptance it acts on stays
    measured (a policy that never drafts never learns that drafting would pay).

    Every ``every``-th step in which the policy left decoding requests without drafts is a probe
    step: up to ``max_requests`` of them, those probed least recently first, draft k tokens. So at
    most 1 / ``every`` of the steps carry probes and each carries a few requests' drafts, whatever
    the batch size (a probe's cost is the draft loop's fixed weight reads, the draft catching up on
    a few contexts, and k verify positions per probing request). The probes' verifies feed the
    policy's AcceptanceEstimate, so speculation comes back on where acceptance is high.

    Args:
        k: draft tokens per probing request.
        every: steps between probe steps (>= 1).
        max_requests: requests probed in one probe step (>= 1).
    """

    def __init__(self, k: int, every: int = 32, max_requests: int = 4):
        for name, value in (("probe_every", every), ("max_requests", max_requests)):
            if not is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        self.k = k
        self.every = every
        self.max_requests = max_requests
        self.num_steps_off = 0  # steps in which some decoding request had no drafts
        self.last_probed: dict[str, int] = {}  # request id -> the probe step it last drafted in

    def apply(self, decodes: list[Request], ks: dict[str, int]) -> dict[str, int]:
        """On a probe step, give a few requests that ``ks`` leaves at 0 k drafts (``ks`` is changed
        in place and returned)."""
        idle = [r.request_id for r in decodes if ks.get(r.request_id, 0) == 0]
        if not idle:
            return ks
        self.num_steps_off += 1
        if self.num_steps_off % self.every:
            return ks
        chosen = sorted(idle, key=lambda rid: self.last_probed.get(rid, -1))[: self.max_requests]
        # remember only requests still decoding (no history of finished ones)
        self.last_probed = {rid: self.last_probed[rid] for rid in idle if rid in self.last_probed}
        for rid in chosen:
            ks[rid] = self.k
            self.last_probed[rid] = self.num_steps_off
        return ks


def parse_prior(arg: str, name: str) -> float:
    """The prior alpha (per-position acceptance probability) in "goodput:0.7" (``arg`` "0.7"; ""
    gives the default).
    Raises: ValueError unless it is a number in [0, 1]."""
    if not arg:
        return DEFAULT_PRIOR_ALPHA
    try:
        value = float(arg)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"policy {name}:{arg}: the argument is the prior alpha (per-position acceptance "
                         f"probability), a number in [0, 1] (e.g. {name}:0.7)")
    return value
