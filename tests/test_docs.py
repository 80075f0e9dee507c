"""The numbers docs/teaching.md quotes are the ones in bench/results/: the expected-numbers table is
rebuilt from the JSON files and compared, so a rerun benchmark cannot leave a stale table."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import load_bench_script

ROOT = Path(__file__).resolve().parents[1]


def load_expected_numbers():
    return load_bench_script("expected_numbers")


def test_teaching_guide_quotes_the_benchmark_files():
    en = load_expected_numbers()
    text = (ROOT / "docs" / "teaching.md").read_text()
    assert en.current_block(text) == en.table(), "run python -m bench expected_numbers --write"


def test_expected_numbers_table_covers_every_claim_and_names_its_source():
    en = load_expected_numbers()
    rows = en.rows()
    claims = [r for r in rows if r[0].startswith("claim: ")]
    assert len(claims) == 6
    assert all(src.split()[0].endswith(".json") and (en.RESULTS / src.split()[0]).exists() for *_, src in rows)


def test_a_missing_marker_is_reported():
    en = load_expected_numbers()
    with pytest.raises(ValueError, match="markers"):
        en.current_block("no table here")


def test_every_notebook_states_its_run_time():
    import json
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        intro = "".join(json.loads(path.read_text())["cells"][0]["source"])
        assert "Expected run time:" in intro, path.name


def test_every_notebook_header_states_the_time_the_committed_budget_run_measured():
    """The "Expected run time" of each notebook is the one bench/results/course_budget.json
    measured (rewritten by `python -m bench course_budget --headers ...`), not a hand guess."""
    import json
    cb = load_bench_script("course_budget")
    budget = json.loads((ROOT / "bench" / "results" / "course_budget.json").read_text())
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(budget["notebooks"]) == notebooks and all("full" in m for m in budget["notebooks"].values())
    for stem, modes in budget["notebooks"].items():
        intro = "".join(json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"][0]["source"])
        assert cb.header_text(stem, modes, budget["machine"]["date"]) in intro, stem


def architecture_section(title: str) -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index(title)
    return text[start:text.index("\n## ", start)]


def test_the_structured_output_section_quotes_the_json_route_run():
    """docs/architecture.md's JSON route table (alpha and tokens per verify step, free / grammar /
    grammar + jump) and the mask cost are the numbers of bench/results/json_routes.json."""
    import json
    import re

    rows = {(r["drafter"], r["arm"]): r for r in json.loads((ROOT / "bench" / "results" / "json_routes.json").read_text())["rows"]}
    section = architecture_section("## Structured output")
    names = {"n-gram, k 4": "ngram", "n-gram tries, topk 2, 8 nodes": "ngram-tree", "shipped head, k 4": "eagle",
             "shipped head tree, topk 2, 8 nodes": "eagle-tree"}
    for name, drafter in names.items():
        line = next(line for line in section.splitlines() if line.startswith(f"  | {name} |"))
        alphas, lengths = (cell.strip().split(" / ") for cell in line.split("|")[2:4])
        arms = [rows[(drafter, arm)] for arm in ("free", "grammar", "grammar+jump")]
        assert alphas == [f"{r['alpha']:.2f}" for r in arms], (name, alphas)
        assert lengths == [f"{r['mean_accepted_length']:.2f}" for r in arms], (name, lengths)
    share = rows[("off", "grammar")]["grammar_s"] / rows[("off", "grammar")]["step_s"]
    assert f"{share:.1%}" in section or f"{100 * share:.1f}" in section
    top = max(r["grammar_share_of_step"] for r in rows.values())
    assert f"up to {top:.1%} of a step" in section
    assert re.search(r"(\d+) of 32 under the grammar", section).group(1) == str(rows[("off", "grammar")]["num_valid_json"])
    readme = " ".join((ROOT / "README.md").read_text().split())
    ngram = [rows[("ngram", arm)]["alpha"] for arm in ("free", "grammar+jump")]
    assert (f"n-gram's alpha from {ngram[0]:.2f} to {ngram[1]:.2f} with jump-forward, and its masks cost {share:.1%} "
            "of a decode step") in readme


def test_the_grammar_library_choice_quotes_its_benchmark():
    import json

    rows = {r["library"]: r for r in json.loads((ROOT / "bench" / "results" / "grammar_libraries.json").read_text())["rows"]}
    section = architecture_section("## Structured output")
    fills = [f"{rows[lib]['fill_accept_us_median']:.1f} us" for lib in ("llguidance", "xgrammar", "outlines-core")]
    assert all(f in section for f in fills), fills
    compile_ms = [rows[lib]["compile_ms_median"] for lib in ("llguidance", "xgrammar", "outlines-core")]
    assert f"{compile_ms[0]:.1f} ms, {compile_ms[1]:.1f} ms and {compile_ms[2]:.0f} ms" in section
    for lib in ("xgrammar", "outlines-core"):
        assert rows[lib]["masks_equal_llguidance"].split("/")[0] in section


def test_the_readme_quotes_the_committed_course_budget():
    """README.md's table of course times and memory peaks is bench/results/course_budget.json's
    (the host's own instruction set) and course_budget_avx2.json's (held to AVX2), row by row."""
    import json

    readme = (ROOT / "README.md").read_text().replace("`bench/results/course_budget.json`)",
                                                       "`course_budget.json`)")
    for name in ("course_budget.json", "course_budget_avx2.json"):
        budget = json.loads((ROOT / "bench" / "results" / name).read_text())
        full = {stem[:2]: modes["full"] for stem, modes in sorted(budget["notebooks"].items())}
        total = sum(v["seconds"] for v in full.values()) / 60
        times = [f"{round(v['seconds'])}" for v in full.values()]
        times[0] += " s"  # the unit once
        peak = max(v["peak_rss_bytes"] for v in full.values()) / 2**30
        row = f"{name}`) | {total:.1f} min | {' | '.join(times)} | {peak:.2f} GiB |"
        assert row in readme, row
