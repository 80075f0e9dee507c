"""How good the GPU model is: published points beside the simulated ones, for notebook 05.

``published_vs_sim()`` returns one row per published point (table, point, published, simulated,
error), from bench/sim/sim_vs_published.py's cached run or computed live; ``plot_published_vs_sim``
draws the published points beside the simulated curves of two tables (GPUStack's Qwen3-8B
latency table and vLLM's H100 decode step times) and every point's error against the course's
targets. ``hardware_with_overhead`` gives 05's explorer an engine-overhead slider: the same device
with another fixed time per step or per draft forward (the number that decides which drafter
pays, docs/cost_model.md sec. 2).
Invariant: the published numbers come from data/published/ only (through minispec.sim.published).
Taught in notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from minispec.cost.hardware import HardwareSpec, load_hardware
from minispec.sim.published import PointResult, error_summary, shape_checks
from minispec.sim.published_tables import TABLES, reproduce

CACHE = Path(__file__).resolve().parents[1] / "bench" / "results" / "sim_vs_published.json"


def published_vs_sim(live: bool = False, tables=None) -> list[dict]:
    """One row per published point: table, point, quantity, published, simulated, error
    (simulated / published - 1), fitted, x (batch size where the table has an axis), label, kind.

    Args:
        live: recompute on the simulator (about a minute for every table) instead of reading
            bench/results/sim_vs_published.json; a missing cache computes live.
        tables: table names (data/published/); None = all.
    Raises: ValueError for an unknown table name.
    """
    names = list(tables) if tables is not None else sorted(TABLES)
    unknown = [n for n in names if n not in TABLES]
    if unknown:
        raise ValueError(f"published table(s) {', '.join(unknown)} unknown: choose from "
                         f"{', '.join(sorted(TABLES))}")
    if not live and CACHE.exists():
        cached = json.loads(CACHE.read_text())["tables"]
        if all(n in cached for n in names):
            return [p for n in names for p in cached[n]["points"]]
    return [r.to_dict() for n in names for r in reproduce(n)]


def _results(rows: list[dict]) -> list[PointResult]:
    keys = ("table", "point", "quantity", "published", "simulated", "fitted", "x", "label")
    return [PointResult(**{k: row[k] for k in keys}) for row in rows]


def table_errors(rows: list[dict]) -> dict[str, dict]:
    """Per table, in first-seen order, over its predicted points (fitted ones left out): ``num_points``,
    the ``median`` and ``worst`` absolute relative error and ``worst_point`` (that point's name).
    Notebook 05's printed lines and the panel titles both read it, so a title cannot quote another
    worst than the line under it. Tables with no predicted point are left out."""
    out = {}
    for table in dict.fromkeys(r["table"] for r in rows):
        pts = [r for r in rows if r["table"] == table and not r["fitted"]]
        if pts:
            worst = max(pts, key=lambda r: abs(r["error"]))
            out[table] = {"num_points": len(pts), "median": statistics.median(abs(r["error"]) for r in pts),
                          "worst": abs(worst["error"]), "worst_point": worst["point"]}
    return out


def table_error_text(table: str, errors: dict) -> str:
    """One table's line: "step_times_h100: 5 points, median error 5.2%, worst 22.6% (sglang_fp8_bs4)"."""
    return (f"{table}: {errors['num_points']} points, median error {errors['median']:.1%}, worst "
            f"{errors['worst']:.1%} ({errors['worst_point']})")


def summary_line(rows: list[dict]) -> str:
    """The errors in one sentence: per kind, the median and the worst over predicted points against the
    course's targets, saying which target each kind missed (or that it met both)."""
    parts = []
    for kind, s in error_summary(_results(rows)).items():
        missed = [name for name, got, target in (("median", s["median_abs_error"], s["target_median"]),
                                                 ("worst", s["worst_abs_error"], s["target_worst"]))
                  if got > target]
        verdict = ("both targets met" if not missed else "misses both targets" if len(missed) == 2
                   else f"misses its {missed[0]} target")
        parts.append(f"{kind}s: median {s['median_abs_error']:.0%}, worst {s['worst_abs_error']:.0%} over "
                     f"{s['num_points']} points (target {s['target_median']:.0%} / {s['target_worst']:.0%}: "
                     f"{verdict})")
    return "; ".join(parts)


def plot_published_vs_sim(ax_or_fig=None, rows: list[dict] | None = None):
    """Three panels: GPUStack's speedup of SGLang fp8 + EAGLE-3 over vLLM bf16 against batch
    size, vLLM's decode step time against batch size (published points, simulated curve, the
    error at each point), and every predicted point's error by table against the targets.

    Args:
        ax_or_fig: None (a new figure), a matplotlib Figure (three subplots are added), or a
            sequence of three Axes.
        rows: ``published_vs_sim()`` rows; None reads the cache (or computes).
    Returns: the Figure.
    """
    rows = rows if rows is not None else published_vs_sim(tables=sorted(TABLES))
    if ax_or_fig is None or hasattr(ax_or_fig, "add_subplot"):  # two panels above, the errors below
        fig = ax_or_fig or plt.figure(figsize=(9, 7.5))          # (9 in: a notebook's width at 100%)
        grid = fig.add_gridspec(2, 2)
        axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    else:
        axes = list(ax_or_fig)
        fig = axes[0].figure
    errors = table_errors(rows)
    by = lambda table, quantity: sorted((r for r in rows  # noqa: E731
                                          if r["table"] == table and r["quantity"] == quantity),
                                        key=lambda r: r["x"])
    for ax, (table, quantity, scale, ylabel, what) in zip(axes, (
            ("gpustack_qwen3_8b_h100", "speedup", 1.0, "speedup over vLLM bf16 (mean latency ratio)",
             "SGLang fp8 + EAGLE-3 over vLLM bf16"),
            ("step_times_h100", "tpot_s", 1e3, "median TPOT (ms)", "vLLM bf16 decode step"))):
        pts = [r for r in by(table, quantity) if "vllm" in r["point"] or table != "step_times_h100"]
        xs = [r["x"] for r in pts]
        ax.plot(xs, [r["simulated"] * scale for r in pts], "-", color="tab:blue", label="simulated")
        ax.plot(xs, [r["published"] * scale for r in pts], "o", color="black", label="published")
        for r in pts:
            ax.annotate(f"{r['error']:+.0%}" + (" (fit)" if r["fitted"] else ""),
                        (r["x"], r["simulated"] * scale),
                        textcoords="offset points", xytext=(4, 6), fontsize=8, color="tab:blue")
        ax.set(xscale="log", xlabel="batch size (requests in flight)")
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.minorticks_off()
        ax.margins(y=0.15)  # room for the error labels under the title
        e = errors[table]  # the table's own worst, as the line printed under the figure gives it
        drawn = any(r["point"] == e["worst_point"] for r in pts)
        ax.set_title(f"Qwen3-8B, H100: {what}\nworst predicted error {e['worst']:.1%}"
                     + ("" if drawn else f" ({e['worst_point']}, not drawn)"), fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    ax = axes[2]
    tables = sorted({r["table"] for r in rows})
    for i, table in enumerate(tables):
        pts = [r for r in rows if r["table"] == table and not r["fitted"]]
        ax.scatter([i] * len(pts), [100 * r["error"] for r in pts], s=18,
                   c=["tab:orange" if r["kind"] == "speedup" else "tab:green" for r in pts])
    for bound, style in ((10, ":"), (20, "--"), (25, "-.")):
        for sign in (1, -1):
            ax.axhline(sign * bound, color="grey", lw=0.8, ls=style)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(tables)), [t.replace("_", "\n", 1) for t in tables], fontsize=8)
    ax.set_ylabel("simulated / published - 1 (%)")
    ax.set_xlabel("orange: speedups (target 10% median, 20% worst); green: times, rates (25%)", fontsize=8)
    shape = shape_checks(_results(rows))  # the targets met and missed: printed under the figure
    ax.set_title("Every predicted point's error, by published table; shape "
                 + ("holds" if not shape else f"misses {len(shape)} point(s)"), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def hardware_with_overhead(name: str = "h100", step_overhead_ms: float | None = None,
                           draft_forward_overhead_ms: float | None = None) -> HardwareSpec:
    """Hardware ``name`` (e.g. "h100", "h100@megakernel") with another fixed time per engine step
    and/or per draft forward, in milliseconds (None keeps the measured value); pass it to
    ``minispec.sim.sweep(hardware=...)``, as notebook 05's explorer does with its overhead slider.

    Raises: ValueError for unknown hardware or a negative time.
    """
    to_s = lambda ms: None if ms is None else ms / 1000.0  # noqa: E731
    return load_hardware(name).with_overheads(step_overhead_s=to_s(step_overhead_ms),
                                              draft_forward_overhead_s=to_s(draft_forward_overhead_ms))
