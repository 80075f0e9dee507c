"""Measured headlines that survive a noisy laptop: interleaved rounds, paired ratios, a verdict.

A laptop shares its cores with a browser, an indexer, a video call. A speedup measured once, arm
after arm, can be the neighbour's doing: a 13% spread between two spec-off runs of the same
workload was measured on a quiet 2-core machine. So a notebook that states a speedup runs the arms
side by side in several rounds (the order rotated each round, so drift hits every arm alike), takes
the ratio within each round, and states the median ratio with its spread. Where the spread covers
the effect it says "too noisy to tell on this run" instead of printing a finding.

Taught in notebooks 01-07; ``bench/course/crossover.py`` interleaves its rounds the same way.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


def interleaved_rounds(arms: dict[str, Callable[[], float]], rounds: int = 3,
                       progress: bool | None = None) -> dict[str, list[float]]:
    """Run every arm once per round, rotating the order each round.

    Args:
        arms: name -> a callable returning one measurement (e.g. tokens/s or seconds).
        rounds: rounds to run (>= 1).
        progress: print one line per round, updated after each arm (its time so far): a long
            cell is not silent for minutes; None prints in a notebook kernel only.
    Returns:
        name -> one measurement per round, in round order (so index i of two arms pairs up).
    Raises:
        ValueError: ``rounds`` < 1 or no arms.
    """
    if rounds < 1 or not arms:
        raise ValueError(f"need rounds >= 1 and at least one arm, got rounds={rounds}, {len(arms)} arms")
    import sys

    if progress is None:
        progress = "ipykernel" in sys.modules
    names = list(arms)
    out: dict[str, list[float]] = {n: [] for n in names}
    start = time.perf_counter()
    for r in range(rounds):
        for i, n in enumerate(names[r % len(names):] + names[: r % len(names)]):
            out[n].append(float(arms[n]()))
            if progress and i + 1 < len(names):  # one line per round, rewritten after each arm ("\r")
                print(f"\rround {r + 1} of {rounds}: {i + 1} of {len(names)} arms done "
                      f"({time.perf_counter() - start:.0f} s so far)", end="", flush=True)
        if progress:
            print(f"\rround {r + 1} of {rounds} done ({len(names)} arms, {time.perf_counter() - start:.0f} s "
                  "so far)"
                  + " " * 8, flush=True)
    return out


def median_time_s(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, in seconds (the median ignores the odd call
    a background program slowed down, where a single timing or a mean would not)."""
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def round_median(values: list[float]) -> float:
    """The middle of the rounds' values (of the two middle ones, the larger: a value some round
    measured, never an average of two). Shared by the notebooks' per-round tables."""
    return sorted(values)[len(values) // 2]


@dataclass(frozen=True)
class Verdict:
    """Ratio of an arm to its baseline over paired rounds.

    Attributes:
        ratio: median of the per-round ratios (arm / baseline; > 1 means the arm measured more).
        low, high: the smallest and largest per-round ratio (the spread).
        finding: "higher" / "lower" (every round on that side, beyond the dead zone),
            "probably higher" / "probably lower" (every round on that side of 1.0, some inside the
            dead zone), "tie" (every round within the dead zone), "noisy" (the rounds disagree
            on the direction) or "one round" (a single round: no spread to judge the ratio by).
    """

    ratio: float
    low: float
    high: float
    finding: str

    @property
    def clear(self) -> bool:
        """True when the rounds agree on a direction beyond the dead zone (higher or lower)."""
        return self.finding in ("higher", "lower")

    def spread_text(self) -> str:
        """"1.23x (1.18-1.30 over the rounds)"-style text."""
        if self.finding == "one round":
            return f"{self.ratio:.2f}x (one round)"
        return f"{self.ratio:.2f}x ({self.low:.2f}-{self.high:.2f} over the rounds)"

    def text(self, higher: str = "faster", lower: str = "slower") -> str:
        """A sentence for a title: the finding in the caller's words, with its spread."""
        if self.finding == "higher":
            return f"{higher}: {self.spread_text()}"
        if self.finding == "lower":
            return f"{lower}: {self.spread_text()}"
        if self.finding == "probably higher":
            return f"probably {higher} (every round, but some within {DEAD_ZONE:.0%}): {self.spread_text()}"
        if self.finding == "probably lower":
            return f"probably {lower} (every round, but some within {DEAD_ZONE:.0%}): {self.spread_text()}"
        if self.finding == "tie":
            return f"no measurable difference: {self.spread_text()}"
        if self.finding == "one round":
            return f"one round, no spread to judge it by: {self.spread_text()}"
        return f"too noisy to tell on this run (the rounds disagree on the direction): {self.spread_text()}"


DEAD_ZONE = 0.05  # about the spread of repeated runs of one workload on a quiet laptop


def compare(arm: list[float], baseline: list[float], dead_zone: float = DEAD_ZONE) -> Verdict:
    """Verdict on ``arm`` against ``baseline``, measured in the same rounds (index i pairs up).

    A direction is a finding only when every round agrees and clears the dead zone (a 5% band
    around 1.0 by default, about the spread of repeated runs on a quiet laptop); every round on one
    side of 1.0 but some inside the band is a one-sided "probably"; every round inside the band is
    a tie; rounds on both sides of 1.0 are noise. A single round is no finding at all ("one round":
    nothing to tell its ratio from noise), whatever its ratio.

    Args:
        arm, baseline: one positive measurement per round (same length, >= 1).
        dead_zone: half-width of the band around 1.0 that counts as no difference.
    Raises:
        ValueError: lengths differ, no rounds, or a non-positive baseline.
    """
    if len(arm) != len(baseline) or not arm:
        raise ValueError(f"need paired rounds of equal length, got {len(arm)} and {len(baseline)}")
    if min(baseline) <= 0:
        raise ValueError(f"baseline measurements must be positive, got {baseline}")
    ratios = [a / b for a, b in zip(arm, baseline)]
    lo, hi = min(ratios), max(ratios)
    if len(ratios) == 1:
        finding = "one round"
    elif lo > 1 + dead_zone:
        finding = "higher"
    elif hi < 1 - dead_zone:
        finding = "lower"
    elif lo >= 1 - dead_zone and hi <= 1 + dead_zone:
        finding = "tie"
    elif lo > 1:
        finding = "probably higher"
    elif hi < 1:
        finding = "probably lower"
    else:
        finding = "noisy"
    return Verdict(statistics.median(ratios), lo, hi, finding)


def ratios_to_median(values: list[float], baseline: list[float]) -> list[float]:
    """Each value over the median of the baseline's rounds (not over one baseline run, whose noise
    would move every ratio together: picking the best of several arms against the slowest
    baseline run overstates them all). Raises ValueError for an empty or non-positive baseline."""
    if not baseline or min(baseline) <= 0:
        raise ValueError(f"baseline rounds must be positive and at least one, got {baseline}")
    base = statistics.median(baseline)
    return [v / base for v in values]


@dataclass(frozen=True)
class Ranking:
    """Arms ordered by their median, with which neighbouring pairs the rounds settle.

    Attributes:
        order: arm names, best first.
        settled: for each neighbouring pair (order[i], order[i + 1]), True when every paired
            round puts them in that order beyond the dead zone.
        verdicts: those pairs' Verdicts (the better arm over the next one).
    """

    order: list[str]
    settled: list[bool]
    verdicts: list[Verdict]

    @property
    def winner(self) -> str | None:
        """The best arm when the rounds settle it against the runner-up, else None."""
        return self.order[0] if self.settled and self.settled[0] else None

    def text(self, better: str = "ahead of") -> str:
        """"a ahead of b (1.20x, 1.10-1.31); order of b and c not settled on this run (...)"-style text."""
        parts = []
        for (a, b), ok, v in zip(zip(self.order, self.order[1:]), self.settled, self.verdicts):
            parts.append(f"{a} {better} {b} ({v.spread_text()})" if ok else
                         f"order of {a} and {b} not settled on this run ({v.spread_text()})")
        return "; ".join(parts) if parts else (self.order[0] if self.order else "")


def rank(arms: dict[str, list[float]], higher_is_better: bool = True,
         dead_zone: float = DEAD_ZONE) -> Ranking:
    """Rank arms measured in the same rounds (index i pairs up) by their median; each neighbouring
    pair is settled only when :func:`compare` finds a clear direction (every round beyond the dead
    zone). A notebook prints a winner or an order only where it is settled.

    Raises: ValueError for no arms, or rounds of different lengths (as compare).
    """
    if not arms:
        raise ValueError("rank needs at least one arm")
    order = sorted(arms, key=lambda n: statistics.median(arms[n]), reverse=higher_is_better)
    settled, verdicts = [], []
    for a, b in zip(order, order[1:]):
        v = compare(arms[a], arms[b], dead_zone) if higher_is_better else compare(arms[b], arms[a], dead_zone)
        verdicts.append(v)
        settled.append(v.finding == "higher")
    return Ranking(order, settled, verdicts)
