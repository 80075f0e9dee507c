"""Where one engine step's time goes, split by torch.profiler: notebook 01's profiled steps.

The notebook profiles a few decode steps at 1 and at 16 requests and splits each step's wall time
with ``step_split`` (the learner's, or ``course.exercises.reference_step_split``): the weight
matmuls, the other ops, and the time no op covers (Python and dispatch between ops, the profiler's
own bookkeeping included). This module reads the rounds: the part that is largest in every round
(None where the rounds disagree), each part's median share, and the chart. Taught in
notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

from course.exercises import PARTS

RESULTS_DIR = Path(__file__).resolve().parents[1] / "bench" / "results"


def largest_part(rounds: list[dict]) -> str | None:
    """The part of ``PARTS`` that is the largest in every round's split, None where rounds differ."""
    found = {max(PARTS, key=split.__getitem__) for split in rounds}
    return found.pop() if len(found) == 1 else None


def median_split(rounds: list[dict]) -> dict:
    """Each part's median over the rounds (seconds), and ``step`` their sum."""
    split = {part: statistics.median(r[part] for r in rounds) for part in PARTS}
    return {**split, "step": sum(split.values())}


def split_line(rounds: list[dict]) -> str:
    """'68% / 17% / 15% of a 20.9 ms step (matmuls / other ops / Python; medians of 3 rounds)'."""
    m = median_split(rounds)
    shares = " / ".join(f"{m[part] / m['step']:.0%}" for part in PARTS)
    return (f"{shares} of a {m['step'] * 1e3:.1f} ms step (matmuls / other ops / Python; medians of "
            f"{len(rounds)} rounds)")


def split_verdict(splits: dict[int, list[dict]]) -> str:
    """How the matmuls and the Python part moved from the smallest load to the largest, as multiples
    and shares; Python's move is called noise only where every round of one lies inside the other's
    range widened by 25%."""
    (lo, few), (hi, many) = min(splits.items()), max(splits.items())
    a, b = median_split(few), median_split(many)
    mm, py = PARTS[0], PARTS[2]
    pa, pb = [r[py] for r in few], [r[py] for r in many]
    noise = ", within the rounds' noise" if min(pb) >= min(pa) / 1.25 and max(pb) <= max(pa) * 1.25 else ""
    return (f"From {lo} to {hi} decodes per step ({hi / lo:.0f}x the tokens) the matmuls took "
            f"{b[mm] / a[mm]:.1f}x their time ({a[mm] / a['step']:.0%} of the step, then "
            f"{b[mm] / b['step']:.0%}); Python and dispatch took {a[py] * 1e3:.1f} ms, then "
            f"{b[py] * 1e3:.1f} ms ({b[py] / a[py]:.1f}x{noise}; {a[py] / a['step']:.0%}, then "
            f"{b[py] / b['step']:.0%} of the step).")


@contextlib.contextmanager
def muted_native_stderr():
    """Send the process's own stderr (file descriptor 2) to the null device inside the block: the
    profiler's C++ side (kineto) writes a line there at every start and stop, which a notebook shows."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def plot_step_split(splits: dict[int, list[dict]], ax=None):
    """One stacked bar per load: each part's median ms per step."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    labels = [f"{n} decode{'s' if n > 1 else ''}" for n in splits]
    medians, left = [median_split(rounds) for rounds in splits.values()], [0.0] * len(splits)
    for part in PARTS:
        ms = [m[part] * 1e3 for m in medians]
        ax.barh(labels, ms, left=left, label=part)
        left = [a + b for a, b in zip(left, ms)]
    ax.set_xlabel("ms per step (median of the rounds, under the profiler)")
    ax.set_title("Where one decode step's time goes, on this machine")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=8)  # off the bars
    return ax


def capture_lines(results_dir: Path = RESULTS_DIR) -> list[str]:
    """The batch-1 float32 step, eager and captured (``--compile on``), as ``python -m bench
    decode_profile`` measured it on the machine its files name (bench/results/decode_profile.json and
    decode_profile_compiled.json): each step's time and the part no op covers, Python and dispatch."""
    eager, captured = (json.loads((results_dir / f"decode_profile{s}.json").read_text())
                       for s in ("", "_compiled"))
    lines = [f"{name:<24} {1e3 * r['step_s']:5.1f} ms a step, {1e3 * r['uncovered_s']:4.1f} ms of it "
             "outside every op (Python and dispatch)"
             for name, r in (("eager", eager), ("captured (--compile on)", captured))]
    saved, ratio = 1e3 * (eager["step_s"] - captured["step_s"]), eager["step_s"] / captured["step_s"]
    where = f"{captured['cpu']}, {captured['date']}"
    return lines + [f"capture took {saved:.1f} ms off the step ({ratio:.2f}x) on {where}"]
