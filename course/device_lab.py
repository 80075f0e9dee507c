"""The packed-device lab's tables, plots and sentences: four levers on one budget, here and modelled.

Notebook 10 measures batch harder, quantize, prefix-cache and speculate on this CPU (interleaved
rounds, each arm against the baseline of its round) and models them for an 8B target on an H100;
this module turns those runs into the tables, the bar chart per device, its computed title, the
takeaway that names where the two rankings part (a reason per lever and direction, the step split
for speculation) and the learner's own ranking beside the measured one. A place in the ranking here
is named only where the rounds settle it against its neighbours. ``real_step_lines`` reads the
committed H200 run (course/gpu.py): a real step's time beside its roofline.
Taught in notebooks/10_packed_device_lab.ipynb.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from course.claims import explain_cost
from course.gpu import RESULTS_DIR
from course.noise import Ranking, Verdict

# the two arms the "on top" comparison sets side by side: speculation added to the other three levers
THREE, ALL_FOUR = "batch + quantize + prefix-cache", "all four"


def here_table(here_rows: dict, here_tok_s: dict, here_verdict: dict, here_goodput: dict) -> list[dict]:
    """One row per arm measured here, for ``show_table``: tokens/s per round, the verdict against the
    baseline, goodput (req/s), the median TTFT (s) and TPOT (ms) over the rounds, and the last round's
    prefix-cache hit rate ("-" without a cache).

    Args:
        here_rows: arm -> its bench rows, one per round (``bench_rows``' dicts).
        here_tok_s: arm -> output tokens/s per round; here_verdict: arm -> its ``Verdict`` against the
            baseline (the baseline itself absent); here_goodput: arm -> median goodput (req/s).
    """
    rows = []
    for name, rs in here_rows.items():
        hit_rate = rs[-1]["prefix_cache_hit_rate"]
        rows.append({"arm": name, "tok/s per round": ", ".join(f"{t:.1f}" for t in here_tok_s[name]),
                     "vs baseline (tokens per device-second)": (here_verdict[name].text("more", "fewer")
                                                                if name in here_verdict else "the reference"),
                     "goodput req/s": f"{here_goodput[name]:.2f}",
                     "TTFT p50": f"{statistics.median(r['ttft_p50_s'] for r in rs):.2f} s",
                     "TPOT p50": f"{statistics.median(r['tpot_p50_s'] for r in rs) * 1000:.0f} ms",
                     "hit rate": "-" if hit_rate is None else f"{hit_rate:.2f}"})
    return rows


def native_quantize_ratio(path: Path = RESULTS_DIR / "course_budget.json") -> float | None:
    """The quantize lever's ratio in the course's reference run of this notebook (full mode, int4
    native), from its first headline; None where that run names none."""
    try:
        head = json.loads(path.read_text())["notebooks"]["10_packed_device_lab"]["full"]["headlines"][0]
    except (OSError, KeyError, IndexError, ValueError):
        return None
    found = re.search(r"quantize (?:gains most alone|least) \((\d+\.\d+)x\)", head)
    return float(found.group(1)) if found else None


def here_notes(here_goodput: dict, ttft_slo_s: float, tpot_slo_s: float, rounds: int,
               quant_support: str = "native") -> list[str]:
    """The lines under the table here: the arms whose goodput is 0 (no request met both SLOs, given
    in seconds), a warning when a single round leaves the ratios without a spread, and one line when
    the quantize lever's format runs emulated here (``quant_support``: ``format_support``'s text for
    it), with the reference run's ratio where int4 is native. May be empty."""
    lines = []
    if quant_support.startswith("emulated"):
        native, why = native_quantize_ratio(), quant_support.split(": ", 1)[-1]
        where = (f"; on the course's reference CPU (AMD EPYC with AVX512-BF16), where int4 is native, "
                 f"quantize gave {native:.2f}x (bench/results/course_budget.json)" if native else "")
        lines.append(f"The quantize lever's int4 runs emulated on this CPU ({why}), so its bar measures "
                     f"that emulation as much as the bytes int4 saves{where}.")
    missed = [name for name, g in here_goodput.items() if g == 0.0]
    if missed:
        lines.append(f"Goodput 0.00 ({', '.join(missed)}): no request of that arm met both SLOs (TTFT under "
                     f"{ttft_slo_s:.2f} s, TPOT under {1000 * tpot_slo_s:.0f} ms), however many tokens it "
                     "made per second: throughput and goodput can rank arms differently.")
    if rounds < 2:
        lines.append("One round (fast mode): a ratio has no spread to judge it by, so read these as a "
                     "sketch, not a finding.")
    return lines


def plot_levers(ratios: dict, lows: dict, highs: dict, goodput: dict, title: str):
    """One horizontal bar per arm: output tokens per device-second over the baseline's, the error bar
    from ``lows`` to ``highs`` (the rounds' spread; pass ``ratios`` for none), speculating arms in red,
    each arm's goodput (req/s) in its label, ``title`` above. Returns the figure (laid out, not shown)."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = list(ratios)
    y = range(len(names))
    ax.barh(y, [ratios[n] for n in names],
            xerr=[[ratios[n] - lows[n] for n in names], [highs[n] - ratios[n] for n in names]],
            color=["tab:red" if "speculate" in n or n == ALL_FOUR else "tab:blue" for n in names], alpha=0.8)
    ax.set_yticks(list(y), [f"{n}\n(goodput {goodput[n]:.2f} req/s)" for n in names], fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("output tokens per device-second, relative to the baseline")
    ax.invert_yaxis(); ax.grid(alpha=0.3, axis="x")
    ax.set_title(title, fontsize=9)
    plt.tight_layout()
    return fig


def here_title(num_requests: int, concurrency: int, ranking: Ranking, verdicts: dict, on_top: Verdict,
               unclear: list[str]) -> str:
    """The title of the chart here: the top and the bottom lever (named as such only where the
    rounds settle them against their neighbour), speculation on top of the other three (``on_top``:
    all four over the three), and how many levers are not clear on this run (``unclear``)."""
    order = ranking.order
    top = (f"{order[0]} gains most alone" if ranking.settled[0] else
           f"{order[0]} highest by median (not settled against {order[1]})")
    bottom = (f"{order[-1]} least" if ranking.settled[-1] else
              f"{order[-1]} lowest by median (not settled against {order[-2]})")
    return (f"This CPU, {num_requests} shared-prefix requests at concurrency {concurrency}: {top} "
            f"({verdicts[order[0]].ratio:.2f}x), {bottom} ({verdicts[order[-1]].ratio:.2f}x);\n"
            f"speculation on top of the other three: "
            f"{on_top.text('more tokens per device-second', 'fewer tokens per device-second')}"
            + (f"; {len(unclear)} of 4 levers not clear on this run" if unclear else ""))


def unclear_note(unclear: list[str], rounds: int) -> str:
    """Why the levers in ``unclear`` are no finding on this run, and that their places could swap."""
    return (f"Not a clear finding on this run ({', '.join(unclear)}): "
            + ("one round has no spread to judge a ratio by" if rounds < 2 else
               "the rounds disagree or some sit within 5% of the baseline")
            + ", so their places in the ranking could swap on a rerun.")


def h100_table(h100_rows: dict, h100_ratio: dict) -> list[dict]:
    """One row per modelled arm, for ``show_table``: tokens/s, the ratio to the baseline (1.00x for
    the baseline itself), goodput (req/s), p50 TTFT and TPOT (ms) and the prefix-cache hit rate."""
    return [{"arm": name, "tok/s": f"{r['throughput_tok_s']:.0f}",
             "vs baseline": f"{h100_ratio.get(name, 1.0):.2f}x", "goodput req/s": f"{r['goodput_rps']:.1f}",
             "TTFT p50": f"{r['ttft_p50_s'] * 1000:.0f} ms", "TPOT p50": f"{r['tpot_p50_s'] * 1000:.1f} ms",
             "hit rate": "-" if r["prefix_cache_hit_rate"] is None else f"{r['prefix_cache_hit_rate']:.2f}"}
            for name, r in h100_rows.items()]


def h100_title(concurrency: int, h100_rank: list[str], h100_ratio: dict, on_top: float, goodput: dict) -> str:
    """The title of the modelled chart: the top and the bottom lever with their ratios, and what
    speculation on top of the other three does to tokens per device-second (``on_top``, a ratio)
    and to goodput (req/s)."""
    return (f"H100 model, 8B target, concurrency {concurrency}: {h100_rank[0]} gains most alone "
            f"({h100_ratio[h100_rank[0]]:.2f}x), {h100_rank[-1]} least ({h100_ratio[h100_rank[-1]]:.2f}x);\n"
            f"speculation on top of the other three: {on_top:.2f}x the tokens per device-second, goodput "
            f"{goodput[THREE]:.0f} -> {goodput[ALL_FOUR]:.0f} req/s")


def split_text(added: dict | None, where: str) -> str:
    """``where`` followed by ``explain_cost(added)``, or the reason there is no split (None)."""
    if added is None:
        return f"{where} no step decoded alone, so the split is not measured"
    return f"{where} {explain_cost(added)}"


def lever_reasons(num_output_tokens: int, cost_here: dict | None, cost_h100: dict,
                  num_draft_rows_h100: float) -> dict[tuple[str, str], str]:
    """Why a lever can sit higher (or lower) here than on the H100 model: (lever, "higher" or
    "lower") -> a reason, and ("speculate", "last"): why speculation ranks last on both.

    Args:
        num_output_tokens: output tokens per request here.
        cost_here, cost_h100: ``neighbour_cost`` of the speculate arm's decode steps against the
            baseline's, here (None: no step decoded alone) and on the H100 model (seconds by part).
        num_draft_rows_h100: the H100 speculate arm's draft rows per decode step.
    """
    rows_h100 = f"{num_draft_rows_h100:.0f} draft rows per step"
    return {
        ("batch harder", "lower"): (
            "a 2-core CPU is compute-bound after about ten tokens per step and 512-token prefill chunks "
            "already fill each step, so more requests in flight mostly queue more arithmetic; on the H100 a "
            "step of 128 decodes is still close to memory-bound, so they share each weight read almost free"),
        ("batch harder", "higher"): (
            "the baseline's decode steps here carry one or two tokens, well below even this CPU's ridge "
            "point, so filling them costs little; on the H100 model the other levers above it save more"),
        ("quantize", "higher"): (
            "int4 reads a sixth of float32's weight bytes, which speeds every decode step here, while the "
            "modelled fp8 halves bf16's bytes and the H100's other levers save more"),
        ("quantize", "lower"): (
            "the int4 kernel unpacks every weight again for each row of a step, so the prefill chunks that "
            "fill most steps here cost more compute, while on the H100 model fp8 halves the weight and K/V "
            "bytes every decode step reads"),
        ("prefix-cache", "higher"): (
            "prompt tokens are compute on this CPU and make up most of the work (about 580 per request "
            f"against {num_output_tokens} output tokens), so skipping more than nine tenths of them saves "
            "most of the device time"),
        ("prefix-cache", "lower"): (
            "here the levers above it cut the cost of the decode steps more than the skipped prefill saves; "
            "on the H100 model the skipped prompt tokens also leave each step's token budget to decodes"),
        ("speculate", "higher"): (
            f"{split_text(cost_here, 'here (n-gram, free to propose)')}, while on the H100 model "
            f"{explain_cost(cost_h100)} ({rows_h100})"),
        ("speculate", "lower"): (
            f"{split_text(cost_here, 'here')}: on a CPU that is compute-bound from about ten tokens per step "
            "every verify row is arithmetic"),
        ("speculate", "last"): (
            f"on the packed H100 model {explain_cost(cost_h100)} ({rows_h100} beside the requests' own), and "
            f"{split_text(cost_here, 'here')}; which part dominates depends on the drafter and the device, "
            "and every rejected row is arithmetic thrown away"),
    }


def place_settled(ranking: Ranking, lever: str) -> bool:
    """True when every round puts ``lever`` on the same side of both its neighbours in ``ranking``."""
    i = ranking.order.index(lever)
    return all(ranking.settled[j] for j in (i - 1, i) if 0 <= j < len(ranking.settled))


def ranking_rows(levers: list[str], here_ranking: Ranking, here_verdict: dict, h100_rank: list[str],
                 h100_ratio: dict) -> list[dict]:
    """One row per lever, for ``show_table``: its rank and ratio here (a rank the rounds do not settle
    marked so) beside its rank and ratio on the H100 model."""
    here_rank = here_ranking.order
    return [{"lever": n, "rank here": (here_rank.index(n) + 1 if place_settled(here_ranking, n)
                                       else f"{here_rank.index(n) + 1} (not settled)"),
             "ratio here": f"{here_verdict[n].ratio:.2f}x", "rank on H100": h100_rank.index(n) + 1,
             "ratio on H100": f"{h100_ratio[n]:.2f}x"} for n in levers]


def takeaway(levers: list[str], here_ranking: Ranking, here_verdict: dict, on_top_here: Verdict,
             h100_rank: list[str], h100_ratio: dict, h100_goodput: dict, on_top_h100: float,
             reasons: dict[tuple[str, str], str]) -> str:
    """The two rankings side by side in sentences: the places they share, each lever that ranks
    higher or lower here with its reason from ``reasons`` (``lever_reasons``; "may be chance" where
    the rounds do not settle its place), where speculation ranks last, and what speculation on top of
    the other three gives on each device (``on_top_here``: a Verdict; ``on_top_h100``: a ratio;
    goodput in req/s)."""
    here_rank = here_ranking.order
    same = [n for n in levers if here_rank.index(n) == h100_rank.index(n)]
    lines = [f"Both rank {', '.join(f'{n} #{here_rank.index(n) + 1}' for n in same)}." if same
             else "The two rankings share no place."]
    for n in levers:
        if n in same:
            continue
        direction = "higher" if here_rank.index(n) < h100_rank.index(n) else "lower"
        reason = (reasons[(n, direction)] if place_settled(here_ranking, n) else
                  "its place here is not settled on this run (the rounds put it within 5% of a neighbour, or "
                  f"disagree: {here_verdict[n].spread_text()} against the baseline), so the "
                  "difference may be chance")
        lines.append(f"{n} ranks #{here_rank.index(n) + 1} here and #{h100_rank.index(n) + 1} on the H100: "
                     f"{reason}.")
    if here_rank[-1] == "speculate" and h100_rank[-1] == "speculate":
        lines.append(f"Speculation ranks last on both: {reasons[('speculate', 'last')]}.")
    elif h100_rank[-1] == "speculate":
        lines.append("Speculation ranks last on the H100 model but not here.")
    lines.append(f"Added to the other three, speculation gives {on_top_h100:.2f}x the tokens per "
                 f"device-second on the H100 model (goodput {h100_goodput[THREE]:.0f} -> "
                 f"{h100_goodput[ALL_FOUR]:.0f} req/s) and here {on_top_here.text('more', 'fewer')}.")
    return " ".join(lines)


def your_ranking(where: str, mine: list[str], measured: list[str], levers: list[str]) -> str:
    """The learner's ranking for ``where`` against the ``measured`` one: how many places match, or
    that no complete ranking was given (``mine`` not a permutation of ``levers``)."""
    if sorted(mine) == sorted(levers):
        hits = [n for n in levers if mine.index(n) == measured.index(n)]
        return (f"Your ranking for {where} placed {len(hits)} of 4 where the numbers did"
                + (f" ({', '.join(hits)})." if hits else ".") + f" Measured: {' > '.join(measured)}; yours: "
                f"{' > '.join(mine)}.")
    return f"You did not rank the levers for {where}; the numbers say {' > '.join(measured)}."


def real_step(gpu: dict, model: str, requests: int, tokens_per_request: int = 1) -> dict:
    """The committed GPU run's step with CUDA graphs for ``model`` at one shape: ``requests`` runs of
    ``tokens_per_request`` tokens (1: decodes; k + 1: verifies). Returns its row (``step_ms`` and
    ``roofline_ms`` in ms, ``context`` in tokens). Raises ValueError naming the shapes measured."""
    rows = [r for r in gpu["steps"][model]["rows"] if r["mode"] == "graphs"]
    shape = (requests, tokens_per_request)
    row = next((r for r in rows if (r["requests"], r["tokens_per_request"]) == shape), None)
    if row is None:
        have = ", ".join(f"{r['requests']}x{r['tokens_per_request']}" for r in rows)
        raise ValueError(f"the GPU run timed no {requests}x{tokens_per_request} step of "
                         f"{model}; it has {have}")
    return row


def _per_token(row: dict, key: str) -> float:
    """Milliseconds per token of a step row's ``key`` ("step_ms" or "roofline_ms")."""
    return row[key] / row["tokens"]


def real_step_lines(gpu: dict, model: str, batch: int, packed: int, k: int) -> list[str]:
    """A real GPU step beside its roofline (``load_gpu_results``' run, CUDA graphs): ``batch`` and
    ``packed`` decodes and ``batch`` verifies of k + 1 tokens, each with its time over its roofline
    (the device's measured bandwidth and matmul rate, no overhead); what batching and the verify rows
    change, measured and on the roofline; and the roofline's share of the ``packed`` step, the part a
    lever priced by bytes or FLOPs acts on. Returns three lines. Raises ValueError as ``real_step``."""
    small, big = real_step(gpu, model, batch), real_step(gpu, model, packed)
    verify = real_step(gpu, model, batch, k + 1)
    shapes = {f"{batch} decodes": small, f"{packed} decodes": big,
              f"{batch} verifies of {k + 1} tokens": verify}
    timed = "; ".join(f"{name} {r['step_ms']:.2f} ms, {r['step_ms'] / r['roofline_ms']:.2f}x its roofline "
                      f"({r['roofline_ms']:.2f} ms)" for name, r in shapes.items())
    gain = {key: _per_token(small, key) / _per_token(big, key) for key in ("step_ms", "roofline_ms")}
    longer = {key: verify[key] / small[key] for key in ("step_ms", "roofline_ms")}
    return [
        f"{gpu['device']['name']} ({gpu['date']}), this engine with CUDA graphs, "
        f"{gpu['steps'][model]['shape']}'s "
        f"shape at a {small['context']}-token context: {timed}.",
        f"Batching {batch} -> {packed} decodes gave {gain['step_ms']:.2f}x the tokens "
        "per second of step time "
        f"(the roofline: {gain['roofline_ms']:.2f}x); {k} draft rows per request made a {batch}-request step "
        f"{longer['step_ms']:.2f}x longer (the roofline: {longer['roofline_ms']:.2f}x).",
        f"The roofline is {big['roofline_ms'] / big['step_ms']:.0%} of a real {packed}-decode step: a lever "
        "priced by bytes or FLOPs (fp8) acts on that part, and no byte or FLOP count prices the other "
        f"{big['step_ms'] - big['roofline_ms']:.2f} ms, so the modelled ratios above are a first estimate of "
        "what such a lever saves on a real engine.",
    ]
