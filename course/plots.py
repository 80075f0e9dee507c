"""Plots the notebooks share: who rides in each step, and step time against tokens."""

from __future__ import annotations

import matplotlib.pyplot as plt

PHASE_COLOURS = {"prefill": "#e8a33d", "decode": "#3d7fe8", "verify": "#3dba6f"}
CHAR_WIDTH_EM = 0.58  # the mean width of a DejaVu Sans character in ems (matplotlib's default font)


def wrap_to_width(text: str, width_in: float, fontsize_pt: float) -> str:
    """``text`` wrapped at spaces to lines of about ``width_in`` inches at ``fontsize_pt`` points;
    its own line breaks are kept."""
    import textwrap

    chars = max(20, int(width_in * 72 / (CHAR_WIDTH_EM * fontsize_pt)))
    return "\n".join(textwrap.fill(line, chars, break_long_words=False) if line else line
                     for line in str(text).split("\n"))


def fit_titles() -> None:
    """From now on, wrap every axes title to its axes' width and every figure title to the figure's,
    so the computed titles of side-by-side panels never run into each other. Idempotent."""
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties

    if getattr(Axes.set_title, "fits_width", False):
        return
    set_title, suptitle = Axes.set_title, Figure.suptitle

    def points(kwargs, default):
        return FontProperties(
            size=kwargs.get("fontsize", kwargs.get("size", plt.rcParams[default]))).get_size_in_points()

    def fitted_set_title(self, label, *args, **kwargs):
        width = self.get_position().width * self.figure.get_figwidth()
        return set_title(self, wrap_to_width(label, width, points(kwargs, "axes.titlesize")), *args, **kwargs)

    def fitted_suptitle(self, t, **kwargs):
        return suptitle(self, wrap_to_width(t, 0.95 * self.get_figwidth(),
                                            points(kwargs, "figure.titlesize")), **kwargs)

    fitted_set_title.fits_width = True
    Axes.set_title, Figure.suptitle = fitted_set_title, fitted_suptitle


def speedup_axes(ax, ylabel: str, ticks: list[int] | None = None) -> None:
    """Style ``ax`` as a speedup against concurrency: a grey line at 1.0 (no gain), concurrency on
    a log-2 axis (ticks at ``ticks`` when given), ``ylabel``, a light grid."""
    ax.axhline(1.0, color="grey", lw=1)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="concurrency", ylabel=ylabel)
    if ticks is not None:
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.minorticks_off()
    ax.grid(alpha=0.3)


def plot_timeline(timeline: list, ax=None, title: str | None = None, max_steps: int | None = None):
    """One row per request, one column per step; colour = phase (prefill / decode / verify).
    Each phase's cells are one PolyCollection (one artist, not one Rectangle per cell): a timeline
    of a thousand cells redraws in a tenth of the time."""
    from matplotlib.collections import PolyCollection

    ax = ax or plt.gca()
    steps = timeline[:max_steps] if max_steps else timeline
    rows: dict[str, int] = {}
    cells: dict[str, list] = {phase: [] for phase in PHASE_COLOURS}
    for x, step in enumerate(steps):
        for rid, phase, _ in step:
            y = rows.setdefault(rid, len(rows))
            cells[phase].append([(x, y), (x + 0.9, y), (x + 0.9, y + 0.8), (x, y + 0.8)])
    for phase, verts in cells.items():
        if verts:
            ax.add_collection(PolyCollection(verts, facecolors=PHASE_COLOURS[phase], linewidths=0))
    ax.set_xlim(0, max(len(steps), 1))
    ax.set_ylim(0, max(len(rows), 1))
    ax.invert_yaxis()
    ax.set_xlabel("engine step")
    ax.set_ylabel("request (in arrival order)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    ax.legend(handles, list(PHASE_COLOURS), loc="upper right", fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def plot_capstone(report: dict, tpot_slo_s: float, names=None):
    """Four panels from grade_policy's report, one bar group per load, one bar per policy:
    interactive SLO attainment (the target marked), interactive and bulk p50 TPOT (ms, the SLO
    dashed), and fleet throughput (tokens/s). Returns the figure."""
    lanes = report["lanes"]
    loads = list(lanes)
    names = names or list(next(iter(lanes.values())))
    panels = [("interactive_attainment", "interactive SLO attainment", 1.0),
              ("interactive_tpot_p50_s", "interactive p50 TPOT (ms)", 1000.0),
              ("bulk_tpot_p50_s", "bulk p50 TPOT (ms)", 1000.0),
              ("fleet_throughput_tok_s", "fleet throughput (tokens/s)", 1.0)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), layout="constrained")  # room for the legend below
    width = 0.8 / len(names)
    for ax, (key, label, scale) in zip(axes.flat, panels):
        for i, name in enumerate(names):
            ax.bar([j + i * width for j in range(len(loads))],
                   [lanes[load][name][key] * scale for load in loads],
                   width, label=name, color="black" if name == "yours" else None)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(loads))], [f"c={load}" for load in loads])
        ax.set_ylabel(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    for j, load in enumerate(loads):  # the interactive lane's target at each load
        axes[0, 0].hlines(report["scores"][load]["attainment_target"], j - width / 2, j + 0.8 - width / 2,
                          colors="red", lw=1.5, label="target" if j == 0 else None)
    axes[0, 1].axhline(tpot_slo_s * 1000, color="grey", ls="--", lw=1, label="TPOT SLO")
    # one legend for all four panels, under them, where it covers no bar
    handles = dict(zip(*reversed(axes[0, 0].get_legend_handles_labels())))
    handles.update(zip(*reversed(axes[0, 1].get_legend_handles_labels())))
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=len(handles),
               fontsize=8)
    return fig


def below_one_text(cs: list[int], speedups: list[float]) -> str:
    """Where a speedup curve sits below 1.0, true to every point: "below 1.0 from c=64" only when
    every later load stays below; "below 1.0 at c=64 only" where a later load rises to 1.0 again."""
    below = [c for c, v in zip(cs, speedups) if v < 1.0]
    if not below:
        return "never below 1.0 here"
    if all(v < 1.0 for c, v in zip(cs, speedups) if c >= below[0]):
        return f"below 1.0 from c={below[0]}"
    return "below 1.0 at c=" + ", ".join(map(str, below)) + " only"
