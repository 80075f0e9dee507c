"""The simulator held to published tables: cited numbers in data/published/, the simulated value
of each, and the error.

A table file holds what its source printed (speedups, latencies, step times, tokens/s), where it printed it,
and the conditions of each point; minispec/sim/published_tables.py (``reproduce``) runs each point on the
simulator (the same engine, scheduler and cost model as every other simulated number). Where a source gives a
speedup but no acceptance, its table fits alpha to ONE point (marked ``fit``) and predicts the rest; fitted
points are shown but not counted in the errors.
Error of a point: simulated / published - 1. The course's targets: speedups within 10% (median)
and 20% (worst), step times, latencies and throughput within 25% (docs/cost_model.md, sec. 9).
Invariant: a table's numbers are only ever read from its data file, never typed into code.
Taught in notebooks/05_messenger_vs_truck.ipynb (``course.published``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

PUBLISHED_DIR = Path(__file__).resolve().parents[2] / "data" / "published"
# what each quantity is held to: speedups (and ratios of speedups) or times and rates
KIND = {"speedup": "speedup", "speedup_ratio": "speedup", "draft_target_time_ratio": "time",
        "latency_s": "time", "tpot_s": "time", "throughput_tok_s": "throughput"}
TARGETS = {"speedup": {"median": 0.10, "worst": 0.20}, "time": {"median": 0.25, "worst": 0.25},
           "throughput": {"median": 0.25, "worst": 0.25}}


@dataclass
class PointResult:
    """One published point beside its simulated value.

    Args:
        table, point: the table's name and the point's id (data/published/TABLE.json).
        quantity: "speedup", "speedup_ratio", "draft_target_time_ratio", "latency_s", "tpot_s" or
            "throughput_tok_s" (units in the name: seconds, tokens/s; the rest are ratios).
        published, simulated: the two values, same unit.
        fitted: True when this point was used to fit acceptance (not a prediction).
        x: where the point sits on its table's axis (batch size, QPS), for plots; None if none.
        label: a few words for tables and plots.
    """

    table: str
    point: str
    quantity: str
    published: float
    simulated: float
    fitted: bool = False
    x: float | None = None
    label: str = ""

    @property
    def error(self) -> float:
        """Relative error, simulated / published - 1."""
        return self.simulated / self.published - 1.0

    @property
    def kind(self) -> str:
        """"speedup", "time" or "throughput": which target the point is held to."""
        return KIND[self.quantity]

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error, "kind": self.kind}


def available_tables() -> list[str]:
    """Names of the tables in data/published/."""
    return sorted(p.stem for p in PUBLISHED_DIR.glob("*.json"))


def load_table(name: str) -> dict:
    """The data file of table ``name`` (citation, setup, points, notes).

    Raises: ValueError for an unknown table (the message lists the known ones).
    """
    path = PUBLISHED_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"published table {name!r} is unknown: choose one of "
                         f"{', '.join(available_tables())}")
    return json.loads(path.read_text())


def point(table: dict, point_id: str) -> dict:
    """The point ``point_id`` of a loaded table. Raises ValueError when it is missing."""
    for p in table["points"]:
        if p["id"] == point_id:
            return p
    raise ValueError(f"table {table['table']!r} has no point {point_id!r}")


def error_summary(results: list[PointResult]) -> dict:
    """Per kind ("speedup", "time", "throughput"): the number of predicted points, the median
    and the worst absolute relative error, and whether the course's targets hold. Fitted points
    are left out (they match by construction)."""
    out = {}
    for kind in ("speedup", "time", "throughput"):
        errs = [abs(r.error) for r in results if r.kind == kind and not r.fitted]
        if not errs:
            continue
        median, worst = statistics.median(errs), max(errs)
        target = TARGETS[kind]
        out[kind] = {"num_points": len(errs), "median_abs_error": median, "worst_abs_error": worst,
                     "target_median": target["median"], "target_worst": target["worst"],
                     "met": median <= target["median"] and worst <= target["worst"]}
    return out


def shape_checks(results: list[PointResult]) -> list[str]:
    """Where a table's speedup moves along its axis (batch size, QPS to saturation), the
    simulated one must move the same way between the same points, and fall below 1 where the
    published one does (no crossover the table does not show, none missed that it shows).
    A ratio of two speedups below (above) 1 is a fall (rise) between its two batch sizes.
    Returns the violations, one sentence each; an empty list when the shape holds."""
    bad = []
    for r in results:
        if r.quantity == "speedup_ratio" and (r.published < 1) != (r.simulated < 1):
            bad.append(f"{r.table} {r.point}: published {r.published:.3f}, simulated {r.simulated:.3f} "
                       "(falls in one, not the other)")
        if r.quantity == "speedup" and (r.published < 1) != (r.simulated < 1):
            bad.append(f"{r.table} {r.point}: published {r.published:.2f}x, simulated {r.simulated:.2f}x "
                       "(a crossover in one only)")
    by_table: dict[str, list[PointResult]] = {}
    for r in results:
        if r.quantity == "speedup":
            by_table.setdefault(r.table, []).append(r)
    for table, rs in by_table.items():
        axis = sorted((r for r in rs if r.x is not None), key=lambda r: r.x)
        for a, b in zip(axis, axis[1:]):
            if (b.published < a.published) != (b.simulated < a.simulated):
                bad.append(f"{table}: from {a.x:g} to {b.x:g} the published speedup goes {a.published:.2f} "
                           f"-> {b.published:.2f}, the simulated {a.simulated:.2f} -> {b.simulated:.2f}")
    return bad
