"""The numbers docs/teaching.md quotes are the ones in bench/results/: the expected-numbers table is
rebuilt from the JSON files and compared, so a rerun benchmark cannot leave a stale table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_expected_numbers():
    spec = importlib.util.spec_from_file_location("expected_numbers", ROOT / "bench" / "expected_numbers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_teaching_guide_quotes_the_benchmark_files():
    en = load_expected_numbers()
    text = (ROOT / "docs" / "teaching.md").read_text()
    assert en.current_block(text) == en.table(), "run python bench/expected_numbers.py --write"


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
    measured (rewritten by `python bench/course_budget.py --headers ...`), not a hand guess."""
    import json
    spec = importlib.util.spec_from_file_location("course_budget", ROOT / "bench" / "course_budget.py")
    cb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cb)
    budget = json.loads((ROOT / "bench" / "results" / "course_budget.json").read_text())
    assert len(budget["notebooks"]) == 9 and all("full" in m for m in budget["notebooks"].values())
    for stem, modes in budget["notebooks"].items():
        intro = "".join(json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text())["cells"][0]["source"])
        assert cb.header_text(stem, modes, budget["machine"]["date"]) in intro, stem
