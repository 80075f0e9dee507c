"""Weight formats in the course: what fewer bytes per weight do to a step here, and to the messenger.

Notebook 01 times a step of n decodes for each of the engine's weight formats and reads each
format's knee; notebook 06 measures speculation's gain with the shipped 4-bit weights beside
float32, in interleaved rounds. This module writes their verdicts from the numbers (the notebook
cells stay the experiments they run) and runs 06's measurement.
"""

from __future__ import annotations

import statistics

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from course.noise import compare, interleaved_rounds
from minispec.core.support.metrics import request_metrics
from minispec.models.kernels import release_weights
from minispec.core.request import SamplingParams


def formats_here(support: dict[str, str]) -> tuple[list[str], list[str]]:
    """Notebook 01's formats on this machine, from ``minispec.models.kernels.format_support``:
    (the formats whose step curve is timed, the formats timed in a box of one decode instead).
    bfloat16 without native instructions is an emulation (several times float32's step, whatever its
    bytes): one decode of it is timed and labelled, not its curve. Unavailable formats are left out."""
    boxed = [f for f in ("bfloat16",) if support[f] != "native"]
    timed = [f for f in ("float32", "bfloat16", "int8", "int4")
             if f not in boxed and not support[f].startswith("unavailable")]
    return timed, boxed


def emulated_line(fmt: str, why: str, one_ms: float, float32_ms: float, bytes_ratio: float) -> str:
    """The line for a format timed in a box: its one decode against float32's, and why it is slow here.

    Args:
        why: format_support's "emulated: ..." text; one_ms, float32_ms: one decode's step (ms);
        bytes_ratio: its weight bytes per step over float32's.
    """
    speed = float32_ms / one_ms
    verdict = ("slower than float32 although it reads fewer bytes: the emulation, not the memory, sets its "
               "step here" if speed < 1 else "faster than float32 even emulated")
    return (f"{fmt} (timed in a box of one decode, not drawn): {bytes_ratio:.2f}x float32's bytes, one "
            f"decode {one_ms:.1f} ms, {speed:.2f}x float32's speed, {verdict}. It runs {why}. On a CPU "
            "with AVX512-BF16 or AMX (setup()'s machine card says which this is) it is native, and its "
            "curve is drawn.")


def quantization_verdict(formats: list[str], bytes_per_step: dict[str, int], step_ms: dict[str, list[float]],
                         knees: dict[str, int], sizes: list[int], spread: float) -> str:
    """The lines under notebook 01's measured formats.

    Args:
        formats: format names, "float32" among them (the baseline).
        bytes_per_step: format -> weight bytes a batch-1 decode step reads.
        step_ms: format -> median step time (ms) for each of ``sizes`` decodes.
        knees: format -> the most decodes still within 25% of its 1-decode step.
        spread: the widest spread of one size over the rounds, relative to its median.
    Returns: the verdict text; a knee is compared only when the rounds settle it (spread <= 25%).
    """
    base_bytes, base_ms = bytes_per_step["float32"], step_ms["float32"][0]
    lines = [f"{f:>8}: {bytes_per_step[f] / base_bytes:4.2f}x float32's bytes per step, one decode at "
             f"{base_ms / step_ms[f][0]:4.2f}x its speed; {sizes[-1]} decodes cost "
             f"{step_ms[f][-1] / step_ms[f][0]:4.1f}x its own one decode" for f in formats]
    if spread > 0.25:
        lines.append(f"One size's rounds spread {spread:.0%} of their median, more than the 25% the knees "
                     "are read at: they are not settled on this run (close other programs "
                     "and run the cell again).")
        return "\n".join(lines)
    fewest = min(formats, key=lambda f: bytes_per_step[f])
    gain = base_ms / step_ms[fewest][0]
    lines.append(f"{fewest} reads {base_bytes / bytes_per_step[fewest]:.1f}x fewer bytes and decodes "
                 f"{gain:.1f}x faster: "
                 + ("less than in proportion, since the rest of a step (attention, norms, the "
                    "engine's own work) does "
                    "not shrink with the weights." if gain < 0.8 * base_bytes / bytes_per_step[fewest] else
                    "about in proportion: the weights were most of the step."))
    if knees[fewest] < knees["float32"]:
        lines.append(f"Its flat start ends sooner ({knees[fewest]} decodes against float32's "
                     f"{knees['float32']}): the ridge moved left, so a verify's extra rows stop riding free "
                     "sooner. Notebook 06 measures what that does to the messenger.")
    else:
        lines.append(f"Its knee did not come before float32's here ({knees[fewest]} against "
                     f"{knees['float32']} decodes): on this CPU both stayed flat, or both bent, within the "
                     "sizes timed.")
    return "\n".join(lines)


def messenger_by_format(model, tokenizer, prompts: list, formats: tuple[str, ...] = ("float32", "int4"),
                        k: int = 4, max_tokens: int = 48, rounds: int = 3) -> dict:
    """Notebook 06: n-gram speculation (k drafts) against plain decode at concurrency 1, for each
    weight format, in interleaved rounds (every arm once per round, order rotating).

    Args:
        model, tokenizer: the bundled target, shared by every engine.
        prompts: chat messages (copy prompts: n-gram lookup finds drafts in them).
        max_tokens: output tokens per request; rounds: rounds of every arm.
    The low-bit copies of the weights it made are released when it returns.
    Returns: {format: {"off_ms": [...], "spec_ms": [...], "speedup": Verdict of off TPOT over spec
        TPOT per round, "acceptance_rate": float}}: mean TPOT in ms per round.
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    stats = {f: {"accepted": 0, "proposed": 0} for f in formats}

    def arm(fmt: str, spec: SpecConfig):
        engine = build_engine(EngineConfig(weights=fmt, spec=spec), model=model, tokenizer=tokenizer)

        def run() -> float:
            tpots = []
            for p in prompts:
                rid = engine.add_request(p, params)
                engine.run_until_done()
                m = request_metrics(engine.release(rid))
                tpots.append(m["tpot_s"] * 1000)
                if spec.enabled:
                    stats[fmt]["accepted"] += m["num_draft_accepted"]
                    stats[fmt]["proposed"] += m["num_draft_proposed"]
            return statistics.mean(tpots)
        return run

    arms = {}
    for fmt in formats:
        arms[(fmt, "off")] = arm(fmt, SpecConfig())
        arms[(fmt, "ngram")] = arm(fmt, SpecConfig(method="ngram", num_speculative_tokens=k))
    measured = interleaved_rounds(arms, rounds=rounds)
    del arms  # the engines go with their closures, and the low-bit copies with them
    for fmt in formats:
        if fmt != "float32":
            release_weights(model, "fast", fmt)
    return {fmt: {"off_ms": measured[(fmt, "off")], "spec_ms": measured[(fmt, "ngram")],
                  "speedup": compare(measured[(fmt, "off")], measured[(fmt, "ngram")]),
                  "acceptance_rate": stats[fmt]["accepted"] / max(stats[fmt]["proposed"], 1)}
            for fmt in formats}


def messenger_verdict(result: dict, k: int, support: dict[str, str] | None = None) -> str:
    """The lines under notebook 06's formats measurement: each format's plain TPOT and speculation's
    gain with its verdict over the rounds (labelled emulated where ``support``, ``format_support``'s
    dict, says this CPU emulates it), then what changed and why, only where the rounds settle it."""
    lines = []
    for fmt, r in result.items():
        v = r["speedup"]
        lines.append(f"{fmt:>8}: spec off {statistics.median(r['off_ms']):5.1f} ms per token, n-gram k={k} "
                     f"{statistics.median(r['spec_ms']):5.1f} ms: speculation {v.ratio:.2f}x ({v.finding}; "
                     f"rounds {v.low:.2f}-{v.high:.2f}x), acceptance rate {r['acceptance_rate']:.2f}")
        if support and support.get(fmt, "native").startswith("emulated"):
            lines.append(f"{'':>8}  {fmt} runs emulated on this CPU ({support[fmt].split(': ', 1)[-1]}): its "
                         "steps measure that emulation as much as its bytes; it is native on a CPU with "
                         "AVX512-BF16 or AMX.")
    if {"float32", "int4"} <= set(result):
        f32, q4 = result["float32"]["speedup"], result["int4"]["speedup"]
        faster = statistics.median(result["float32"]["off_ms"]) / statistics.median(result["int4"]["off_ms"])
        lines.append(f"4-bit weights make the plain decode {faster:.1f}x faster here.")
        if f32.finding in ("higher", "probably higher") and q4.finding in ("lower", "probably lower", "tie"):
            lines.append("With them the messenger stops paying: the same drafts, but a verify of k + 1 rows "
                         "now costs several plain steps, because the int4 kernel unpacks every weight for "
                         "each row. The bytes speculation saved are gone, and its extra rows spend the "
                         "compute 4-bit decode now runs on: quantization, batching and speculation drew on "
                         "one budget.")
        elif q4.ratio < f32.ratio:
            lines.append(f"Speculation gains less with them ({q4.ratio:.2f}x against {f32.ratio:.2f}x): a "
                         "cheaper plain step leaves less memory time to save, and the verify's extra rows "
                         "cost more compute.")
        else:
            lines.append("Speculation's gain did not shrink with 4-bit weights on this run; notebook 01's "
                         "curves show whether this CPU's int4 step climbs with the rows as steeply as the "
                         "course machine's did.")
    return "\n".join(lines)
