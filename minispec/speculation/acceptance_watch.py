"""AcceptanceWatch: the engine's warning when speculation stops paying.

An engine observer (``Engine.add_observer``): the builder gives every engine that speculates one
(minispec/build/engine.py), which reads each step's kept verifies and warns once per engine in the
``logging`` logger "minispec", on the run-based alpha or on tokens per verify step per unit of
cost, never on the acceptance rate (accepted / proposed, ``minispec.core.support.metrics``),
which falls with k by construction. Taught in notebooks 04 and 08.
"""

from __future__ import annotations

import logging

log = logging.getLogger("minispec")


class AcceptanceWatch:
    """Notices speculation that never pays, over windows of ``window`` verify steps.

    It warns on one of two numbers, never on the acceptance rate (accepted / proposed), which falls
    with k by construction: the drafts after a verify's first rejection count as proposed and can
    never count as accepted, so a good draft at k 8 reads lower than at k 2 (notebook 04; notebook
    07 shows the watch at work):
    - the per-position acceptance estimated from runs, alpha = accepted drafts / (accepted drafts
      + first rejections): a verify that accepts j drafts and rejects the next adds j and 1 (one
      whose drafts all pass adds no rejection), so alpha does not move with k
      (``speculation.estimate.AcceptanceEstimate`` counts runs the same way). Below ``min_alpha``
      almost no draft passes, whatever k is;
    - given ``cost`` (a verify step's time in plain decode steps: its draft forwards and verify
      rows included, e.g. from the cost model or measured), the mean accepted length per unit of
      cost: below 1 a verify step emits fewer tokens per second than a plain step would.

    As an engine observer (``watch(record)``) it logs the warning, once in the watch's life, to the
    ``logging`` logger "minispec" (a notebook that sweeps poor acceptance on purpose raises that
    logger's level, e.g. with ``course.quiet_engine_log``); ``observe`` counts outputs
    without logging and returns the warning, for a caller that reads the estimates itself.

    Args:
        window: verify steps per window (64: alpha 0.25 then reads 0.25 +- 0.05, far from 0.1).
        min_alpha: run-based alpha below which a window counts as not paying.
        cost: a verify step's cost in plain steps (None: alpha alone decides).
        source: what the warning names as speculating (the builder passes the drafter's class).
    """

    def __init__(self, window: int = 64, min_alpha: float = 0.1, cost: float | None = None, source: str = ""):
        self.window = window
        self.source = source
        self.min_alpha = min_alpha
        self.cost = cost
        self.num_draft_proposed = self.num_draft_accepted = self.num_rejections = 0
        self.num_verify_steps = self.num_verify_emitted = 0
        self.warned = False

    @property
    def alpha(self) -> float | None:
        """The run-based alpha of the window so far: accepted / (accepted + first rejections)."""
        runs_ended = self.num_draft_accepted + self.num_rejections
        return (self.num_draft_accepted / runs_ended if runs_ended else None if not self.num_verify_steps
                else 1.0)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed draft tokens of the window so far (what the watch does not warn on)."""
        return self.num_draft_accepted / self.num_draft_proposed if self.num_draft_proposed else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per verify step of the window so far, bonus included."""
        return self.num_verify_emitted / self.num_verify_steps if self.num_verify_steps else None

    def __call__(self, record) -> None:
        """Engine observer: count the step's kept verifies (``record.result.outputs``); log the
        warning when a window closes low, once."""
        warning = self.observe(record.result.outputs)
        if warning:
            log.warning("%s%s", warning, f" ({self.source})" if self.source else "")

    def observe(self, outputs) -> str | None:
        """Count one step's verifies (EmittedTokens); a warning message when a window closes low."""
        for o in outputs:
            if o.num_draft_proposed:
                self.num_draft_proposed += o.num_draft_proposed
                self.num_draft_accepted += o.num_draft_accepted
                self.num_rejections += o.num_draft_accepted < o.num_draft_proposed
                self.num_verify_steps += 1
                self.num_verify_emitted += o.num_draft_accepted + 1
        if self.warned or self.num_verify_steps < self.window:
            return None
        alpha, length, steps = self.alpha, self.mean_accepted_length, self.num_verify_steps
        self.num_draft_proposed = self.num_draft_accepted = self.num_rejections = 0
        self.num_verify_steps = self.num_verify_emitted = 0
        per_cost = None if self.cost is None else length / self.cost
        if alpha >= self.min_alpha and (per_cost is None or per_cost >= 1.0):
            return None
        self.warned = True
        why = (f"per-position acceptance alpha {alpha:.3f} (accepted drafts over accepted drafts and first "
               f"rejections)" if alpha < self.min_alpha else
               f"{length:.2f} tokens per verify step for a step costing {self.cost:.2f} plain steps "
               f"({per_cost:.2f} of a plain step's tokens per unit of time)")
        return (f"speculation is not paying: {why} over the last {steps} verify steps, mean accepted length "
                f"{length:.2f}. Turn speculation off for this traffic, try another drafter, or use the "
                "goodput "
                "policy, which measures acceptance and stops drafting; on the command line: --spec off, "
                "--spec ngram "
                "or --draft, --policy goodput")
