"""Speculative decoding measured at batch 1: what each measurement says, in plots and sentences.

Notebook 04 runs the experiments (the synthetic drafter's alpha sweep, rejection sampling on a toy
vocabulary, the k sweep of n-gram lookup and the distilled draft); this module reads them. Every
sentence is chosen from the measured numbers: a drafter "wins" only by more than the spread of
this machine's spec-off runs, and each speedup is taken against their median
(``course.noise.ratios_to_median``), never against one run.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from course import headline
from course.exercises import expected_tokens_per_step
from course.noise import ratios_to_median

DRAFTERS = ("ngram", "draft")  # the k sweep's speculative arms, in the order it reports them


def _two_places(value: float | None) -> str:
    """``value`` with two decimals, or "-" for None (a row without drafts)."""
    return "-" if value is None else f"{value:.2f}"


def _formula_gaps(alphas: list[float], measured: list[float], k: int) -> tuple[list[float], list[float], int]:
    """The formula's mean accepted length per alpha, each measurement's relative gap to it, and the
    index of the largest gap (by size)."""
    predicted = [expected_tokens_per_step(a, k) for a in alphas]
    gaps = [m / p - 1 for m, p in zip(measured, predicted)]
    return predicted, gaps, max(range(len(alphas)), key=lambda i: abs(gaps[i]))


def plot_alpha_sweep(alphas: list[float], measured: list[float], k: int):
    """The mean accepted length (tokens per verify step) against alpha: the formula's curve, the
    measured points, and the largest gap in the title.

    Args:
        alphas: the synthetic drafter's per-position acceptance probabilities, in the order run.
        measured: the mean accepted length measured at each alpha (tokens per verify step).
        k: draft tokens per verify step.
    Returns: the axes.
    """
    _, gaps, worst = _formula_gaps(alphas, measured, k)
    grid = [i / 100 for i in range(0, 100)]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(grid, [expected_tokens_per_step(a, k) for a in grid], label="(1 - a^(k+1)) / (1 - a)")
    ax.scatter(alphas, measured, color="C1", zorder=3, label="measured (synthetic drafter)")
    ax.set_xlabel("alpha (per-position acceptance probability)")
    ax.set_ylabel(f"mean accepted length (tokens/step, k = {k})")
    ax.set_title(headline(f"Measured {measured[0]:.2f} tokens/step at alpha {alphas[0]}, {measured[-1]:.2f} "
                          f"at alpha {alphas[-1]} (k = {k});\nlargest gap to the formula {gaps[worst]:+.1%}"),
                 fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax


def alpha_sweep_lines(alphas: list[float], measured: list[float], num_steps: list[int], k: int) -> list[str]:
    """The largest gap between measurement and formula, and why, when it exceeds 5%.

    Args:
        alphas, measured, k: as :func:`plot_alpha_sweep`.
        num_steps: the verify steps behind each measurement.
    Returns: the lines to print.
    """
    predicted, gaps, worst = _formula_gaps(alphas, measured, k)
    lines = [f"Largest gap between measurement and formula: {gaps[worst]:+.1%} at alpha {alphas[worst]} "
             f"({measured[worst]:.2f} measured, {predicted[worst]:.2f} predicted, over {num_steps[worst]} "
             "verify steps)."]
    if abs(gaps[worst]) > 0.05:
        lines.append("More than 5%: with few verify steps per point the average is noisy, and each request's "
                     "last step is cut short by max_tokens, which pulls the measurement below the formula.")
    return lines


def total_variation(probs: torch.Tensor, other: torch.Tensor) -> float:
    """Total variation distance of two distributions over the same tokens: half their summed absolute
    difference (0 identical, 1 disjoint)."""
    return 0.5 * float((probs - other).abs().sum())


def plot_emitted_probs(draft_probs: torch.Tensor, target_probs: torch.Tensor, emitted_probs: torch.Tensor):
    """Bars per token id: the draft's, the target's and the measured emitted distribution, with the
    emitted tokens' distance to each in the title.

    Args:
        draft_probs, target_probs, emitted_probs: [V] probabilities over the same toy vocabulary.
    Returns: the axes.
    """
    xs = torch.arange(len(target_probs))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(xs - 0.27, draft_probs, width=0.27, label="draft_probs")
    ax.bar(xs, target_probs, width=0.27, label="target_probs")
    ax.bar(xs + 0.27, emitted_probs, width=0.27, label="emitted (measured)")
    ax.set_xlabel("token id")
    ax.set_ylabel("probability")
    tv_target = total_variation(emitted_probs, target_probs)
    tv_draft = total_variation(emitted_probs, draft_probs)
    ax.set_title(f"Emitted tokens lie {tv_target:.3f} from target_probs and {tv_draft:.3f} from draft_probs "
                 f"(total variation distance)", fontsize=10)
    ax.legend()
    return ax


def emitted_probs_lines(draft_probs: torch.Tensor, target_probs: torch.Tensor, emitted_probs: torch.Tensor,
                        num_accepted: int, n: int) -> list[str]:
    """Whether rejection sampling kept the target's distribution: the acceptance rate against the
    overlap it estimates, and the emitted tokens' distance to the target against sampling noise.

    Args:
        draft_probs, target_probs, emitted_probs: [V] probabilities over the same toy vocabulary.
        num_accepted: draft tokens accepted over the ``n`` single-draft steps.
    Returns: the lines to print (Leviathan et al. 2023, section 3.5: alpha = sum(min(target, draft))).
    """
    tv_target = total_variation(emitted_probs, target_probs)
    tv_draft = total_variation(emitted_probs, draft_probs)
    # the distance n draws from target_probs itself land from it, on average (half-normal per token)
    tv_noise = 0.5 * float((2 * target_probs * (1 - target_probs) / (torch.pi * n)).sqrt().sum())
    overlap = float(torch.minimum(target_probs, draft_probs).sum())
    lines = [f"Acceptance rate {num_accepted / n:.3f} over {n} single-draft steps; "
             f"the overlap sum(min(target_probs, draft_probs)) predicts {overlap:.3f}.",
             f"Distance of the emitted tokens from target_probs: {tv_target:.3f}; {n} draws from "
             f"target_probs itself would land about {tv_noise:.3f} away by chance."]
    if tv_target > 3 * tv_noise:
        lines.append("That is more than sampling noise explains: the emitted tokens do not follow the target "
                     "here.")
    elif tv_target < tv_draft:
        lines.append("Within sampling noise of the target, and far from the draft: verification kept the "
                     "target's distribution.")
    return lines


class KSweep:
    """A k sweep at concurrency 1 (``bench_rows`` rows: spec off, n-gram and the draft at each k),
    each speculative row's speedup taken against the median spec-off run.

    The same spec-off workload ran once per k: how far those runs spread is this machine's noise
    (``noise``), and a speedup closer to 1.0 than ``margin`` (the noise, at least 10%) is read as
    breaking even. Building one sets ``speedup_vs_off`` on every speculative row, in place.
    """

    def __init__(self, rows: list[dict]):
        """Args: rows: ``bench_rows`` rows with "spec" in ("off", *DRAFTERS), "k",
        "throughput_tok_s" (tokens/s), and for the speculative rows "acceptance_rate",
        "mean_accepted_length", "draft_time_s" and "target_time_s" (seconds)."""
        self.rows = rows
        self.off_tput = [r["throughput_tok_s"] for r in rows if r["spec"] == "off"]
        self.noise = max(self.off_tput) / min(self.off_tput) - 1
        self.margin = max(0.10, self.noise)
        for r in rows:
            if r["spec"] != "off":
                r["speedup_vs_off"] = ratios_to_median([r["throughput_tok_s"]], self.off_tput)[0]
        self.by_method = {m: [r for r in rows if r["spec"] == m] for m in DRAFTERS}

    def best(self, method: str) -> dict:
        """The row of ``method`` ("ngram" or "draft") with the highest speedup."""
        return max(self.by_method[method], key=lambda r: r["speedup_vs_off"])

    def table(self) -> list[dict]:
        """The rows as ``show_table`` rows: k, drafter, tokens/s, acceptance rate, tokens per verify
        step and the speedup against the median spec-off run ("-" where a number does not apply)."""
        return [{"k": r["k"], "drafter": r["spec"], "tok/s": f"{r['throughput_tok_s']:.1f}",
                 "acceptance rate": _two_places(r["acceptance_rate"]),
                 "tokens / verify": _two_places(r["mean_accepted_length"]),
                 "vs median spec off": "-" if r["spec"] == "off" else f"{r['speedup_vs_off']:.2f}x"}
                for r in self.rows]

    def caption(self) -> str:
        """The table's caption: what every speedup is measured against."""
        return ("Every speedup below, in the chart and in the lines under it is against the median of the "
                f"{len(self.off_tput)} spec-off runs")

    def best_k_text(self, method: str) -> str:
        """The best k of ``method``, named only when it beats the runner-up by more than this run's noise."""
        rs = sorted(self.by_method[method], key=lambda r: -r["speedup_vs_off"])
        top = rs[0]
        if len(rs) > 1 and top["speedup_vs_off"] < (1 + self.margin) * rs[1]["speedup_vs_off"]:
            return (f"{method} {top['speedup_vs_off']:.2f}x at k={top['k']}, k={rs[1]['k']} within the noise "
                    f"({rs[1]['speedup_vs_off']:.2f}x): best k not settled")
        return f"best {method} {top['speedup_vs_off']:.2f}x (k={top['k']})"

    def verdict(self, r: dict) -> str:
        """One measured row as a sentence: wins or not, and the tokens and cost per speculative step
        behind it (speedup = L / C: L the mean accepted length, C a speculative step's cost in plain
        decode steps)."""
        tokens, speedup = r["mean_accepted_length"], r["speedup_vs_off"]
        cost = tokens / speedup  # C: one speculative step, in plain decode steps (L / speedup)
        draft_share = r["draft_time_s"] / (r["draft_time_s"] + r["target_time_s"])
        margin, noise = self.margin, self.noise
        # within the margin counts as even: spec-off runs of the same prompts differ by several percent on
        # a shared CPU
        outcome = ("wins" if speedup >= 1 + margin else
                   (f"about breaks even (within {margin:.0%})" if speedup >= 1 - margin else "loses"))
        if outcome == "wins" and r["acceptance_rate"] < 0.2:
            outcome = ("looks like a win, but at an acceptance rate under 0.2 it is too noisy to tell on "
                       f"this run (one run per arm, spec-off runs spread {noise:.0%})")
        text = (f"{r['spec']} at k={r['k']}: acceptance rate {r['acceptance_rate']:.2f}, mean accepted "
                f"length L = {tokens:.2f}, speedup {speedup:.2f}x, so a speculative step cost C = {cost:.2f} "
                f"plain steps. It {outcome}: {tokens - 1:.2f} extra tokens per step against {cost - 1:.2f} "
                "extra steps of cost")
        if outcome != "loses" and abs(speedup - (1 + margin)) < 0.05:
            text += (f". {speedup:.2f}x sits within 0.05 of the {1 + margin:.2f}x line between a win and "
                     "breaking even, and each arm ran once: a rerun, or a busier machine, can read it the "
                     "other way (the course's reference runs did, bench/results/course_headlines.json)")
        if cost < 0.95:
            text += (". A speculative step includes a full target forward, so on a quiet machine it cannot "
                     "cost less than a plain step: C below 1 means the spec-off run was slowed by something "
                     "else, most likely other programs busy on the same cores. Run the cell again before "
                     "trusting this row")
        elif speedup < 1.0 and tokens >= 2 and draft_share < 0.05:
            text += (f". Emitting {tokens:.2f} tokens per step with an almost free drafter and still losing "
                     "means each step took far longer than k extra positions cost at batch 1 (notebook 01): "
                     "other programs busy on the same cores make timings like this noisy, so run the cell "
                     "again on a quiet machine")
        elif speedup < 1.05:
            text += (f". The drafter's own work took {draft_share:.0%} of the compute time; the rest of the "
                     f"extra cost is the wider verify forward ({r['k']} extra positions) and its "
                     f"bookkeeping. At an acceptance rate of {r['acceptance_rate']:.2f} the extra tokens do "
                     "not pay for that work on this machine")
        return text + "."

    def noise_text(self) -> str:
        """How far the spec-off runs spread, and the margin that spread sets."""
        return (f"The {len(self.off_tput)} spec-off runs of the same prompts spread {self.noise:.0%} in "
                f"tokens/s: a speedup within {self.margin:.0%} of 1.0 is read as breaking even, not as a "
                "finding.")


def plot_k_sweep(sweep: KSweep):
    """Speedup over the median spec-off run (tokens/s ratio) against k, one line per drafter, the
    best k of each and the spec-off spread in the title. Returns the axes."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for method, rs in sweep.by_method.items():
        ax.plot([r["k"] for r in rs], [r["speedup_vs_off"] for r in rs], marker="o", label=method)
    ax.axhline(1.0, color="grey", lw=1)
    ax.set(xlabel="k (draft tokens per verify step)", ylabel="speedup over spec off (tokens/s ratio)")
    ax.set_title(headline(f"Concurrency 1, copy prompts, against the median spec-off run: "
                          f"{sweep.best_k_text('ngram')};\n{sweep.best_k_text('draft')}; spec-off runs of "
                          f"the same prompts spread {sweep.noise:.0%}"), fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    return ax
