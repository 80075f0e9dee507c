"""Static against continuous batching, and the truck under load, as notebook 02 measures them.

Static batching admits B requests and keeps the batch until its longest request is done;
continuous batching (Orca, Yu et al. 2022) refills a free slot at the next step
(``minispec.tools.workload.run_closed_loop``). This module runs the static side and writes the lines
under both runs; then, for the closed loop at several concurrencies in interleaved rounds, it
draws the two panels and writes their titles and verdicts, stating a direction only where every
round agrees (``course.noise.compare``). Taught in notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

from course import headline
from course.noise import Verdict, round_median


def run_static_batches(engine, prompts: list, params: list, batch_size: int) -> float:
    """Static batching: admit ``batch_size`` requests, run all of them to completion, then the next ones.

    Args:
        engine: a fresh engine (``max_num_seqs`` at least ``batch_size``).
        prompts: one prompt per request (anything ``engine.add_request`` takes).
        params: one SamplingParams per request, in the same order.
    Returns: the wall time of the whole run in seconds, on the engine's clock.
    """
    t0 = engine.clock()
    for i in range(0, len(prompts), batch_size):
        for j in range(i, min(i + batch_size, len(prompts))):
            engine.add_request(prompts[j], params[j])
        engine.run_until_done()
    return engine.clock() - t0


def static_vs_continuous_text(num_tokens: int, static_wall_s: float, cont_wall_s: float, static_steps: int,
                              cont_steps: int, num_same: int, num_requests: int) -> str:
    """The lines under the two runs: each one's tokens per second and steps, continuous batching's
    gain in both, and why those gains differ (only where they do), or why some outputs differ.

    Args:
        num_tokens: output tokens of all requests (the same in both runs).
        static_wall_s, cont_wall_s: each run's wall time in seconds.
        static_steps, cont_steps: each run's engine steps.
        num_same: requests whose output tokens are the same in both runs, out of ``num_requests``.
    Returns: the lines, joined by newlines.
    """
    speedup = static_wall_s / cont_wall_s
    fewer_steps = static_steps / cont_steps
    lines = [f"static    : {num_tokens / static_wall_s:6.1f} tok/s, {static_steps} steps",
             f"continuous: {num_tokens / cont_wall_s:6.1f} tok/s, {cont_steps} steps",
             f"Continuous batching took {cont_steps} steps against {static_steps} ({fewer_steps:.2f}x fewer) "
             f"and ran {speedup:.2f}x the tokens per second; {num_same} of {num_requests} requests produced "
             "the same tokens in both runs."]
    if speedup > 1.2 * fewer_steps:
        lines.append("It gained more in tokens per second than in steps, which an idle machine does not do "
                     "(its steps are fuller, so they cost at least as much): other programs shared the CPU "
                     "during the static run; close them and run the cell again.")
    elif speedup < 0.9 * fewer_steps:
        lines.append("It gained less in tokens per second than in steps: its steps carry more requests, and "
                     "on a CPU a step with more tokens costs more time (notebook 01); on a GPU the two gains "
                     "stay close.")
    if num_same < num_requests:
        lines.append("A few outputs differ: in a batch of another shape the float sums run in another order, "
                     "which can flip a near-tie between the two likeliest tokens.")
    return "\n".join(lines)


def concurrency_lines(conc: list[int], tput_rounds: dict, tpot_rounds: dict, rounds: int) -> str:
    """One line per concurrency: median throughput (tokens/s) and p50 TPOT (ms) with their range over
    the rounds.

    Args:
        conc: the concurrencies run, ascending.
        tput_rounds, tpot_rounds: concurrency -> throughput (tokens/s) / p50 TPOT (ms) per round.
        rounds: the number of rounds, for the text.
    Returns: the lines, joined by newlines.
    """
    return "\n".join(
        f"concurrency {cc:2d}: {round_median(tput_rounds[cc]):6.1f} tok/s "
        f"({min(tput_rounds[cc]):.1f}-{max(tput_rounds[cc]):.1f}), p50 TPOT "
        f"{round_median(tpot_rounds[cc]):5.0f} ms ({min(tpot_rounds[cc]):.0f}-{max(tpot_rounds[cc]):.0f}) "
        f"over {rounds} rounds" for cc in conc)


def plot_load_rounds(a, b, conc: list[int], tput_rounds: dict, tpot_rounds: dict, more: Verdict,
                     per_user: Verdict) -> None:
    """The two panels: throughput (a) and p50 TPOT (b) against concurrency, each the median over the
    rounds with a bar from the slowest to the fastest round, titled with the highest load's verdict
    against the lowest (through ``headline``).

    Args:
        a, b: the two axes.
        conc: the concurrencies, ascending; tput_rounds, tpot_rounds: as :func:`concurrency_lines`.
        more: ``compare`` of the highest load's throughput rounds against the lowest's.
        per_user: the same for p50 TPOT.
    """
    for ax, values, color in ((a, tput_rounds, "C0"), (b, tpot_rounds, "C1")):
        mid = [round_median(values[cc]) for cc in conc]
        ax.errorbar(conc, mid, yerr=[[m - min(values[cc]) for m, cc in zip(mid, conc)],
                                     [max(values[cc]) - m for m, cc in zip(mid, conc)]],
                    marker="o", color=color, capsize=3)
    load = conc[-1] // conc[0]
    a.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="throughput (tokens/s)")
    a.set_title(headline(f"The truck at {load}x the load: throughput {more.text('higher', 'lower')}"),
                fontsize=9)
    b.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="p50 TPOT (ms/token)")
    tpot_ms = [round_median(tpot_rounds[cc]) for cc in conc]
    b.set_title(headline(f"Each user's p50 TPOT {tpot_ms[0]:.0f} -> {tpot_ms[-1]:.0f} ms: "
                         + per_user.text("slower per user", "faster per user")), fontsize=9)
    for ax in (a, b):
        ax.grid(alpha=0.3)


def load_verdict(conc: list[int], more: Verdict, per_user: Verdict, rounds: int) -> str:
    """The lines under the two panels: both ratios with their spread, then what the throughput and
    TPOT findings say (a GPU's truck against this CPU's), each only where the rounds settle it.

    Args:
        conc: the concurrencies, ascending; more, per_user: as :func:`plot_load_rounds`.
        rounds: the number of rounds, for the text.
    Returns: the lines, joined by newlines.
    """
    lines = [f"Medians over {rounds} rounds, bars from the slowest to the fastest round. From concurrency 1 "
             f"to {conc[-1]}: throughput {more.spread_text()}, p50 TPOT {per_user.spread_text()}."]
    if not more.clear or not per_user.clear:
        lines.append("Where a headline says 'too noisy to tell', the rounds disagreed about the direction: "
                     "other programs shared the CPU during some of them. Close them and run the cell again "
                     "before reading a ratio off this run.")
    if more.finding == "higher" and more.ratio < 1.2:
        lines.append("Throughput grew only a little: each step cost about as much more as it carried, so the "
                     "step was compute-bound. On a GPU this gain is close to the load's.")
    if per_user.finding == "higher":
        lines.append(f"Each user's tokens came {per_user.ratio:.1f}x slower: on this CPU a step of "
                     f"{conc[-1]} decodes is compute-bound, so the step time grows with the batch; on a GPU "
                     "TPOT stays near flat to far larger batches.")
    elif per_user.finding == "tie":
        lines.append("Each user's tokens came about as fast as alone: the steps stayed close to memory-bound "
                     "(or bound by the engine's fixed per-step work), the truck's best case. 'Slower per "
                     "user' shows once a step's arithmetic outgrows its weight read, which a GPU reaches "
                     "only at far larger batches.")
    elif per_user.finding == "lower":
        lines.append("Each user's tokens came faster under load in every round, which a step whose cost only "
                     "grows with its tokens does not do: at concurrency 1 the engine's fixed per-step work, "
                     "or a CPU that raises its clock only under sustained load, made the lone user's steps "
                     "slow. The truck's lesson stands on throughput; the 'slower per user' side shows once "
                     "the batch is large enough for the step to be compute-bound.")
    return "\n".join(lines)
