"""Plots the notebooks share: who rides in each step, and step time against tokens."""

from __future__ import annotations

import matplotlib.pyplot as plt

PHASE_COLOURS = {"prefill": "#e8a33d", "decode": "#3d7fe8", "verify": "#3dba6f"}


def plot_timeline(timeline: list, ax=None, title: str | None = None, max_steps: int | None = None):
    """One row per request, one column per step; colour = phase (prefill / decode / verify)."""
    ax = ax or plt.gca()
    steps = timeline[:max_steps] if max_steps else timeline
    rows: dict[str, int] = {}
    for x, step in enumerate(steps):
        for rid, phase, _ in step:
            y = rows.setdefault(rid, len(rows))
            ax.add_patch(plt.Rectangle((x, y), 0.9, 0.8, color=PHASE_COLOURS[phase], lw=0))
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
