"""The expected-numbers table of docs/teaching.md, built from the benchmark JSON in bench/results/.

    python -m bench expected_numbers            # print the table (markdown)
    python -m bench expected_numbers --write    # replace the table in docs/teaching.md

An instructor compares a class's numbers with these before trusting them. Every number here is
read from a results file written by a benchmark script on the reference machine (2-core AMD EPYC
VM, no GPU); nothing is typed in. tests/test_docs.py fails when docs/teaching.md and the files
disagree, so rerunning a benchmark means rerunning this with --write.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "teaching.md"
BEGIN, END = "<!-- expected-numbers: begin (python -m bench expected_numbers --write) -->", "<!-- expected-numbers: end -->"


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def crossover_curve(rows: list[dict], spec: str, prompts: str) -> str:
    """'2.44x at c=1 -> 1.09x at c=32' for one speculation setting of crossover.json."""
    pts = sorted((r["concurrency"], r["speedup_vs_off"]) for r in rows if r["spec"] == spec and r["prompts"] == prompts)
    below = [c for c, s in pts if s < 1.0]
    return (f"{pts[0][1]:.2f}x at c={pts[0][0]} -> {pts[-1][1]:.2f}x at c={pts[-1][0]}"
            + (f" (below 1.0 from c={below[0]})" if below else " (never below 1.0)"))


def rows() -> list[tuple[str, str, str, str]]:
    """(what, notebook, expected number, source file and command) for each line of the table."""
    hf = load("compare_hf.json")
    dec, bat, ver = hf["decode"], hf["batch"], hf["verify"]["variants"]
    fast, ref = dec["variants"]["fast"], dec["variants"]["reference"]
    ng = hf["ngram"]["variants"]["fast"]
    cross = load("crossover.json")["rows"]
    draft = load("draft_eval_sharegpt.json")
    d4 = draft["routes"]["sharegpt"]["4"]
    claims = {c["claim"]: c for c in load("seed_claims.json")["claims"]}
    compare = "compare_hf.json (`python -m bench compare_hf`)"
    out = [
        ("batch-1 decode, fast kernels", "00, 01",
         f"{fast['tok_s']:.1f} tok/s = {fast['ratio']:.2f}x transformers' generate "
         f"({dec['hf_generate_tok_s']:.1f}); {fast['roofline_fraction']:.0%} of the bandwidth roofline", compare),
        ("batch-1 decode, reference kernels", "00, 01", f"{ref['tok_s']:.1f} tok/s = {ref['ratio']:.2f}x generate", compare),
        ("verify step (k 4) over a decode step", "01, 04",
         f"fast {ver['fast']['verify_over_decode']:.2f}x, reference {ver['reference']['verify_over_decode']:.2f}x", compare),
        ("16 concurrent requests", "02",
         f"{bat['variants']['fast']['tok_s']:.0f} tok/s = {bat['variants']['fast']['ratio']:.2f}x transformers' "
         f"generate_batch", compare),
        ("n-gram speculation (k 8) on copy prompts, concurrency 1", "04",
         f"{ng['ngram_vs_off']:.2f}x spec off, acceptance rate {ng['acceptance_rate']:.2f}", compare),
        ("crossover, n-gram k 4 on copy prompts", "05", crossover_curve(cross, "ngram", "copy"),
         "crossover.json (`python -m bench crossover`)"),
        ("crossover, shipped EAGLE draft k 2 on chat", "05", crossover_curve(cross, "draft", "chat"),
         "crossover.json"),
        ("crossover, synthetic drafter (alpha 0.6, k 4)", "05", crossover_curve(cross, "synthetic", "chat"),
         "crossover.json"),
        ("shipped draft on held-out ShareGPT prompts, k 4", "04",
         f"first-position acceptance {d4['acceptance_by_position'][0]:.2f}, acceptance rate "
         f"{d4['acceptance_rate']:.2f}, mean accepted length {d4['mean_accepted_length']:.2f}; "
         f"draft cost {draft['cost']['c']:.3f} of a target step",
         "draft_eval_sharegpt.json (`python -m bench draft_eval --routes sharegpt`)"),
    ]
    jr = {(r["drafter"], r["arm"]): r for r in load("json_routes.json")["rows"]}
    source_jr = "json_routes.json (`python -m bench json_routes`)"
    for drafter, name in (("ngram", "n-gram k 4"), ("eagle", "shipped EAGLE draft k 4")):
        arms = [jr[(drafter, arm)] for arm in ("free", "grammar", "grammar+jump")]
        out.append((f"JSON route, {name}, concurrency 8: free / grammar / grammar + jump-forward", "08",
                    "alpha " + " / ".join(f"{r['alpha']:.2f}" for r in arms) + ", tokens per verify step "
                    + " / ".join(f"{r['mean_accepted_length']:.2f}" for r in arms), source_jr))
    off = jr[("off", "grammar")]
    out.append(("JSON route, the grammar's cost", "08", f"{1000 * off['grammar_s']:.2f} ms per spec-off decode step at "
                f"concurrency 8, {off['grammar_s'] / off['step_s']:.1%} of the step; {off['num_valid_json']} of "
                f"{off['num_requests']} outputs valid under the schema", source_jr))
    budget = load("course_budget.json")
    source = "course_budget.json (`python -m bench course_budget`)"
    total = {"full": 0.0, "fast": 0.0}
    for stem, modes in budget["notebooks"].items():
        parts = []
        for mode in ("full", "fast"):
            if mode in modes:
                total[mode] += modes[mode]["seconds"]
                parts.append(f"{modes[mode]['seconds']:.0f} s" + ("" if mode == "full" else " in fast mode"))
        peak = max(m["peak_rss_bytes"] for m in modes.values()) / 2**30
        out.append((f"notebook {stem} run time", stem[:2], "; ".join(parts) + f"; kernel peak {peak:.2f} GiB", source))
    fast_all = all("fast" in m for m in budget["notebooks"].values())
    out.append(("the whole course", "all", f"{total['full'] / 60:.1f} min"
                + (f"; {total['fast'] / 60:.1f} min in fast mode" if fast_all else ""), source))
    if (RESULTS / "course_headlines.json").exists():  # the same course quiet and with one core busy
        heads = load("course_headlines.json")
        for stem, t in heads["seconds"].items():
            rows_nb = [r for r in heads["rows"] if r["notebook"] == stem]
            flips = sum(r["flip"] for r in rows_nb)
            out.append((f"notebook {stem}, quiet against one core busy", stem[:2],
                        f"{t['quiet']:.0f} s quiet, {t['busy']:.0f} s busy; of {len(rows_nb)} headlines, {flips} "
                        f"claim the opposite direction and {sum(r['changed'] for r in rows_nb)} change their words",
                        "course_headlines.json "
                        "(`python -m bench course_budget --compare bench/results/course_budget.json "
                        "bench/results/course_budget_busy.json`)"))
    for name, c in claims.items():
        out.append((f"claim: {name}", "03, 05, 06, 07, 08", f"here: {c['measured']}; modelled: {c['modelled']}",
                    "seed_claims.json (`python -m bench seed_claims`)"))
    return out


def table() -> str:
    lines = [BEGIN, "| what | notebook | expected on the reference machine | from |", "|---|---|---|---|"]
    lines += [f"| {w} | {nb} | {v} | {src} |" for w, nb, v, src in rows()]
    return "\n".join(lines + [END])


def current_block(text: str) -> str:
    """The table between the markers in ``text``. Raises ValueError when a marker is missing."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"docs/teaching.md lacks the markers {BEGIN!r} / {END!r}")
    return text[text.index(BEGIN): text.index(END) + len(END)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="replace the table in docs/teaching.md")
    args = p.parse_args(argv)
    new = table()
    if args.write:
        text = DOC.read_text()
        DOC.write_text(text.replace(current_block(text), new))
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
