"""Step time against tokens per step, measured here and modelled for an H100: where the flat start ends.

Notebook 01 times engine steps that carry n tokens (n decodes, or one n-token chunk: a verify's
shape) in interleaved rounds and draws them beside the cost model's H100 curve. This module holds
the timed engines (``decode_engine``, ``decode_stepper``, ``chunk_stepper``), the knee read off a curve
(``flat_up_to``: the last size within 25% of the 1-token step), the two panels, and the title and
lines under them, chosen from the measured numbers only: a knee is stated only when the rounds
settle it (spread at most 25%). Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import itertools
from typing import Callable

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig
from course.noise import median_time_s
from minispec.core.request import SamplingParams
from minispec.cost.model import CostModel

DECODE_PROMPT_TOKENS = 16  # each decode_stepper request's prompt: one KV block of 16 tokens
SETTLED_SPREAD = 0.25  # a knee read off medians that moved more than this between rounds is noise
MODELLED_CONTEXT = 512  # tokens of context per token in notebook 01's modelled H100 curve


def decode_engine(model, tokenizer, n: int, max_tokens: int, weights: str | None = None):
    """An engine holding n requests past their prefill, so each ``step()`` is one step of n decodes
    (each request may emit ``max_tokens``: that many steps before the first finishes).

    Args:
        model, tokenizer: the target every engine shares (``build_engine``'s).
        weights: ``EngineConfig.weights`` (None: the engine's default format).
    """
    # 16 prompt tokens and 19 outputs (5 calls of 3 steps): 3 blocks of 16 per request (a larger
    # pool only costs memory)
    blocks_per_request = -(-(DECODE_PROMPT_TOKENS + max_tokens) // 16)
    engine = build_engine(EngineConfig(num_kv_blocks=max(16, blocks_per_request * n + 2), max_model_len=256,
                                       weights=weights,
                                       scheduler=SchedulerConfig(max_num_batched_tokens=max(512, 32 * n))),
                          model=model, tokenizer=tokenizer)
    for i in range(n):
        engine.add_request([1 + i % 50] * DECODE_PROMPT_TOKENS,
                           SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    engine.step()  # all prefills
    return engine


def decode_stepper(model, tokenizer, n: int, repeats: int, calls: int, weights: str | None = None
                   ) -> Callable[[], float]:
    """An engine holding n requests past their prefill (``decode_engine``): each call times one step
    of n decodes ``repeats`` times and returns their median in ms; it serves ``calls`` calls."""
    engine = decode_engine(model, tokenizer, n, calls * repeats + 4, weights)
    return lambda: median_time_s(engine.step, repeats) * 1000


def chunk_stepper(model, tokenizer, n: int, repeats: int) -> Callable[[], float]:
    """An engine that prefills one fresh n-token prompt per step (a request with max_tokens=1).

    Args:
        model, tokenizer: the target every engine shares.
        n: tokens in each prompt, so in each timed step.
        repeats: prompts timed per call (their median is returned).
    Returns: a callable that runs ``repeats`` one-step requests and returns their median time in ms.
    """
    engine = build_engine(EngineConfig(num_kv_blocks=64, max_model_len=512,
                                       scheduler=SchedulerConfig(max_num_batched_tokens=max(n, 16))),
                          model=model, tokenizer=tokenizer)
    fresh = itertools.count(2)  # a new token id per chunk, so the prefix cache never serves a repeat

    def one():
        engine.add_request([next(fresh) % 4000 + 2] * n, SamplingParams(max_tokens=1, temperature=0))
        engine.run_until_done()
    return lambda: median_time_s(one, repeats) * 1000


def flat_up_to(ns: list[int], ms: list[float], tol: float = 1.25) -> int:
    """The most tokens per step before the step time first exceeds tol x the 1-token step.

    Args:
        ns: tokens per step, ascending, the first the 1-token step.
        ms: each size's step time (any unit: only ratios are read).
        tol: the allowed growth over the first size's time.
    Returns: the last size of ``ns`` before the first one over ``tol`` x ``ms[0]``.
    """
    last = ns[0]
    for n, t in zip(ns, ms):
        if t > tol * ms[0]:
            break
        last = n
    return last


def plot_measured_steps(ax, sizes: list[int], decode_ms: list[float], chunk_ms: list[float]):
    """The left panel: step time (ms) against tokens in the step (log axis), for n decodes and for one
    n-token chunk, with a legend and a grid; no title. Returns the axes."""
    ax.plot(sizes, decode_ms, marker="o", label="n decodes (batch of n)")
    ax.plot(sizes, chunk_ms, marker="s", label="one n-token chunk")
    ax.set(xscale="log", xlabel="tokens in the step", ylabel="step time (ms)")
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def plot_modelled_steps(ax, grid: list[int], modelled_ms: list[float]):
    """The right panel: the cost model's step time (ms) against tokens in the step, each with 512
    tokens of context, both axes log, with a grid; no title. Returns the axes."""
    ax.plot(grid, modelled_ms, marker="o", color="C2")
    ax.set(xscale="log", yscale="log", xlabel="tokens in the step (each with 512 tokens of context)",
           ylabel="modelled step time (ms)")
    ax.grid(alpha=0.3)
    return ax


def measured_title(sizes: list[int], decode_ms: list[float], here_flat: int, spread: float) -> str:
    """The left panel's title: the knee (only when the rounds settle it) and the growth over the sizes.

    Args:
        sizes: tokens per step timed; decode_ms: the median step time (ms) of each size's decodes.
        here_flat: :func:`flat_up_to` of the decodes.
        spread: the widest spread of one size over the rounds, relative to its median.
    """
    knee = (f"This device: within 25% of 1 token up to {here_flat} tokens; " if spread <= SETTLED_SPREAD else
            f"This device: knee not settled (rounds spread {spread:.0%}); ")
    return knee + f"{decode_ms[-1] / decode_ms[0]:.1f}x the time for {sizes[-1]}x the tokens"


def this_machine_knee(here_flat: int, spread: float) -> str:
    """This machine's knee for a title that sets it beside another device's (notebook 01's H200 chart):
    "this machine up to 8" only when the rounds settle it, as :func:`measured_title` decides, else
    "this machine: knee not settled (rounds spread 43%)", so no later chart states a knee an earlier
    one withheld.

    Args:
        here_flat: :func:`flat_up_to` of the measured decodes.
        spread: the widest spread of one size over the rounds, relative to its median.
    """
    if spread <= SETTLED_SPREAD:
        return f"this machine up to {here_flat}"
    return f"this machine: knee not settled (rounds spread {spread:.0%})"


def step_curve_verdict(sizes: list[int], decode_ms: list[float], chunk_ms: list[float], spread: float,
                       cost: CostModel, grid: list[int], modelled_ms: list[float]) -> str:
    """The lines under notebook 01's two panels: how settled the run is, the knee measured here and
    what it means, where the modelled H100 stays flat, and the signs that other programs shared the CPU.

    Args:
        sizes: tokens per step timed; decode_ms, chunk_ms: each size's median step time (ms).
        spread: the widest spread of one size over the rounds, relative to its median.
        cost: the H100 cost model the right panel draws; grid: its sizes (tokens per step);
        modelled_ms: its step time (ms) at each size, each token with 512 tokens of context.
    Returns: the lines, joined by newlines.
    """
    here_flat, h100_flat = flat_up_to(sizes, decode_ms), flat_up_to(grid, modelled_ms)
    lines = []
    if spread > SETTLED_SPREAD:
        lines.append(f"One size's rounds differed by {spread:.0%} of its median, more than the 25% the knee "
                     "is read at: the knee below is not settled on this run (run the cell again with other "
                     "programs closed).")
    dips = [(m, n) for (m, dm), (n, dn) in zip(zip(sizes, decode_ms), zip(sizes[1:], decode_ms[1:]))
            if dn < 0.9 * dm]
    if dips:
        lines.append(f"{' and '.join(f'{n} decodes ran faster than {m}' for m, n in dips)}: more work cannot "
                     "take less time on a quiet machine, so these sizes are inside this run's noise.")
    lines.append("Measured here: a step of n decodes stays within 25% of a 1-token step up to n = "
                 f"{here_flat}{' in the medians (not settled)' if spread > SETTLED_SPREAD else ''}; "
                 f"{sizes[-1]} decodes cost {decode_ms[-1] / decode_ms[0]:.1f}x one decode, and "
                 f"one {sizes[-1]}-token chunk {chunk_ms[-1] / chunk_ms[0]:.1f}x a 1-token chunk.")
    if spread > SETTLED_SPREAD:
        lines.append("Where the step time here leaves its flat start, and so where this CPU turns "
                     "compute-bound, is not settled on this run.")
    elif here_flat >= sizes[-1]:
        lines.append("This device stayed memory-bound over every size measured here.")
    else:
        lines.append(f"Past {here_flat} tokens the step time here grows with the tokens (neighbouring sizes "
                     "can swap by a few ms: timing noise): the step has turned compute-bound, as a CPU's "
                     "does early, having far less arithmetic per byte of memory bandwidth than a GPU (a low "
                     "ridge point).")
    c = MODELLED_CONTEXT
    h100_compute = [n for n in grid if cost.forward_cost(n, n, n * c, n * c, n).bound == "compute"]
    lines.append(f"The modelled H100 stays within 25% up to {h100_flat} tokens, and "
                 + (f"turns compute-bound at {h100_compute[0]} tokens." if h100_compute else
                    "is memory-bound at every size plotted: what grows is the KV cache read (each token "
                    "brings 512 tokens of context), not the arithmetic."))
    faster = [n for n, d, ch in zip(sizes, decode_ms, chunk_ms)
              if d < 0.8 * decode_ms[0] or ch < 0.8 * chunk_ms[0]]
    if spread > 0.5:
        lines.append(f"One size's timings differed by {spread:.0%} between rounds: other programs shared the "
                     "CPU while this cell ran. The medians set that aside when it hit one round, not when it "
                     "lasted the whole cell: if the curve above is not smooth, close them and run the cell "
                     "again.")
    if faster:
        lines.append(f"Steps of {', '.join(map(str, faster))} tokens ran faster than a 1-token step, which "
                     "an idle machine does not do: other programs shared the CPU while the cell above ran, "
                     "so its times are partly noise; close them and run both cells again.")
    return "\n".join(lines)
