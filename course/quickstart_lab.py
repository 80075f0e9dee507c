"""Step time against tokens in the step, read from notebook 00's busier run.

The run's own smallest and widest steps (its bottom and top quarters by tokens) are compared by
their medians, so one slow step cannot choose the verdict; steps far slower than others of their
size are named apart (a one-time cost or another program, not the tokens). The notebook cell keeps
the run; this module draws its steps and writes the title and the lines under the plot from them.
Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import statistics

import matplotlib.pyplot as plt


def _quarters(num_tokens: list[int], step_ms: list[float]) -> tuple[list[tuple], list[tuple]]:
    """The run's smallest and widest steps: its bottom and top quarters by tokens, as (tokens, ms)."""
    order = sorted(range(len(num_tokens)), key=lambda j: num_tokens[j])
    quarter = max(1, len(num_tokens) // 4)
    small = [(num_tokens[j], step_ms[j]) for j in order[:quarter]]
    wide = [(num_tokens[j], step_ms[j]) for j in order[-quarter:]]
    return small, wide


def _growth(num_tokens: list[int], step_ms: list[float]) -> tuple[float, float, float, float] | None:
    """(median tokens of the smallest quarter, of the widest, the widest's time over the smallest's,
    its tokens over the smallest's); None when both quarters' medians hold as many tokens."""
    small, wide = _quarters(num_tokens, step_ms)
    small_tokens, wide_tokens = statistics.median(x for x, _ in small), statistics.median(x for x, _ in wide)
    if wide_tokens <= small_tokens:
        return None
    more_time = statistics.median(y for _, y in wide) / statistics.median(y for _, y in small)
    return small_tokens, wide_tokens, more_time, wide_tokens / small_tokens


def step_time_title(num_tokens: list[int], step_ms: list[float]) -> str:
    """The plot's title: how much more time the widest quarter of the steps took than the smallest.

    Args:
        num_tokens: tokens in each step (prefill + decode), one per step.
        step_ms: each step's duration in milliseconds.
    Returns: "Here Nx the tokens in a step took Mx the time", or "S steps, all of T tokens" when the
        two quarters' medians hold as many tokens.
    """
    growth = _growth(num_tokens, step_ms)
    if growth is None:
        return f"{len(num_tokens)} steps, all of {num_tokens[0]} tokens"
    _, _, more_time, more_tokens = growth
    return f"Here {more_tokens:.0f}x the tokens in a step took {more_time:.1f}x the time"


def step_time_growth(num_tokens: list[int], step_ms: list[float]) -> dict | None:
    """The widest quarter's median step time over the smallest quarter's ("time"), its tokens' ratio
    ("tokens"), and the range the quarters' own spread allows ("low": the widest quarter's 25th
    percentile over the smallest's 75th; "high": the reverse), so a prediction is judged against
    what the steps themselves vary by. None when both quarters' medians hold as many tokens.

    Args: as :func:`step_time_title` (tokens per step, step durations in ms).
    """
    growth = _growth(num_tokens, step_ms)
    if growth is None:
        return None
    small, wide = ([y for _, y in q] for q in _quarters(num_tokens, step_ms))
    quartiles = lambda ys: statistics.quantiles(ys, n=4, method="inclusive")[::2] if len(ys) > 1 else ys * 2
    (s25, s75), (w25, w75) = quartiles(small), quartiles(wide)
    return {"time": growth[2], "tokens": growth[3], "low": w25 / s75, "high": w75 / s25}


def step_time_verdict(num_tokens: list[int], step_ms: list[float]) -> str | None:
    """The line under the plot: the widest quarter's time against the smallest's, and what that says
    (noise, memory-bound, compute-bound after a handful of tokens, or compute-bound throughout).

    Args: as :func:`step_time_title` (tokens per step, step durations in ms).
    Returns: the sentence, or None when the two quarters' medians hold as many tokens.
    """
    growth = _growth(num_tokens, step_ms)
    if growth is None:
        return None
    small_tokens, wide_tokens, more_time, more_tokens = growth
    if more_time < 0.8:
        why = ("the wider steps ran faster, which an idle machine does not do: other programs shared the CPU "
               "while this cell ran, so these times are mostly noise; close them and run the cell again")
    elif more_time < 1.25:
        why = "the step time barely grew: it goes into reading the weights (memory-bound), as on a GPU"
    elif more_time < more_tokens / 2:
        why = (f"each token cost {more_tokens / more_time:.1f}x less, but the step did not stay flat: a CPU "
               "has little arithmetic per byte of memory bandwidth, so a step turns compute-bound after a "
               "handful of tokens (notebook 01 finds where); a GPU's step stays nearly flat for tens")
    else:
        why = ("the step time grew almost as fast as its tokens: here the step is compute-bound (or other "
               "work shared the CPU: run the cell again); a GPU's step stays nearly flat for tens")
    return (f"The widest quarter of the steps (median {wide_tokens:.0f} tokens) took {more_time:.1f}x the "
            f"time of the smallest quarter (median {small_tokens:.0f} tokens): {why}.")


def slow_steps_note(num_tokens: list[int], step_ms: list[float]) -> str | None:
    """A note on the steps far slower than others of their size: over 3x the median of the steps with
    as many tokens, and over 3x the median of all steps.

    Args: as :func:`step_time_title` (tokens per step, step durations in ms).
    Returns: the note (their count and the slowest in ms), or None when there are none.
    """
    typical = {x: statistics.median(y for xx, y in zip(num_tokens, step_ms) if xx == x)
               for x in set(num_tokens)}
    outliers = [(x, y) for x, y in zip(num_tokens, step_ms)
                if y > 3 * typical[x] and y > 3 * statistics.median(step_ms)]
    if not outliers:
        return None
    return (f"{len(outliers)} step(s) took over 3x the usual time for their size (up to "
            f"{max(y for _, y in outliers):.0f} ms): a step's size did not cause that. A CPU runs other "
            "programs too, and a step that is the first of its shape pays once for preparing its kernels; "
            "the warm-up above takes most of those, and the medians above set the rest aside.")


def plot_step_times(num_tokens: list[int], step_ms: list[float], ax=None):
    """One dot per step: its tokens (log2 axis) against its time in ms, grid on; no title.

    Args: as :func:`step_time_title`; ax: the axes to draw on (the current ones by default).
    Returns: the axes.
    """
    ax = ax or plt.gca()
    ax.scatter(num_tokens, step_ms, s=12, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens in the step (prefill + decode)")
    ax.set_ylabel("step time (ms)")
    ax.grid(alpha=0.3)
    return ax
