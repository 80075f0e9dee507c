"""bench/ holds nothing that nothing names (issue 45, item 2): every script is named outside itself
(README, docs, notebooks, tests, the package, another script, the Makefile or data/), and every
result file is named by something that reads or cites it. A file that fails this is dead weight:
delete it (git keeps its history) or say where it is used."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
WHERE = ["README.md", "Makefile", "docs", "notebooks", "tests", "minispec", "bench", "data", ".ci"]
SUFFIXES = {".md", ".py", ".ipynb", ".json", ".toml", ""}


@functools.lru_cache(maxsize=1)
def texts() -> tuple[tuple[Path, str], ...]:
    """Every text a name could appear in (result files' own data aside), read once."""
    out = []
    for where in WHERE:
        base = ROOT / where
        files = [base] if base.is_file() else [p for p in base.rglob("*") if p.is_file()]
        for p in files:
            if p.suffix not in SUFFIXES or "results" in p.parts or ".ipynb_checkpoints" in p.parts:
                continue
            try:
                out.append((p, p.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                continue
    return tuple(out)


def corpus(excluding: Path) -> str:
    """Every text but ``excluding``'s own."""
    return "\n".join(text for p, text in texts() if p != excluding)


SCRIPTS = sorted(BENCH.glob("*/*.py"))
# the entry point and nothing else at bench/'s top: every script sits in its question's folder
MAX_ENTRY_FILES = 10


def run_bench(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_bench_script_is_named_somewhere_else(path):
    assert path.stem in corpus(path), f"bench/{path.parent.name}/{path.name} is named nowhere outside itself"


def test_bench_has_one_entry_point_and_scripts_grouped_by_question():
    """issue 45, item 2: `python -m bench` is the entry point; the scripts sit in one folder per
    question (bench/__main__.py's QUESTIONS), each with a docstring its listing shows."""
    top = sorted(p.name for p in BENCH.glob("*.py"))
    assert top == ["__main__.py"], top
    entry = load_bench_entry()
    assert {p.parent.name for p in SCRIPTS} == set(entry.QUESTIONS), {p.parent.name for p in SCRIPTS}
    assert len(entry.QUESTIONS) <= MAX_ENTRY_FILES
    assert len({p.stem for p in SCRIPTS}) == len(SCRIPTS), "two scripts share a name"
    assert all(entry.summary(p) for p in SCRIPTS), [p.name for p in SCRIPTS if not entry.summary(p)]


def load_bench_entry():
    spec = importlib.util.spec_from_file_location("bench_entry", BENCH / "__main__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_python_m_bench_lists_every_script_and_runs_one():
    listing = run_bench()
    assert listing.returncode == 0, listing.stderr
    assert all(f"  {p.stem} " in listing.stdout for p in SCRIPTS), listing.stdout
    # a script runs as `python bench/<question>/<name>.py` would: its own argv and --help
    helped = run_bench("sim_speed", "--help")
    assert helped.returncode == 0 and "usage: sim_speed.py" in helped.stdout, helped


def test_an_unknown_bench_name_is_one_line_naming_it_and_the_choices():
    res = run_bench("crossovr")
    assert res.returncode == 2
    assert "'crossovr'" in res.stderr and "crossover" in res.stderr and len(res.stderr.splitlines()) == 1


@pytest.mark.parametrize("path", sorted((BENCH / "results").iterdir()), ids=lambda p: p.name)
def test_every_result_file_is_named_by_what_reads_or_cites_it(path):
    text = corpus(path)
    assert path.name in text or path.stem in text, f"bench/results/{path.name} is read or cited by nothing"
