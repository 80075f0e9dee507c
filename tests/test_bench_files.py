"""bench/ holds nothing that nothing names (issue 45, item 2): every script is named outside itself
(README, docs, notebooks, tests, the package, another script, the Makefile or data/), and every
result file is named by something that reads or cites it. A file that fails this is dead weight:
delete it (git keeps its history) or say where it is used."""

from __future__ import annotations

import functools
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


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_bench_script_is_named_somewhere_else(path):
    if path.name == "__init__.py":
        return
    assert path.stem in corpus(path), f"bench/{path.name} is named nowhere outside itself"


@pytest.mark.parametrize("path", sorted((BENCH / "results").iterdir()), ids=lambda p: p.name)
def test_every_result_file_is_named_by_what_reads_or_cites_it(path):
    text = corpus(path)
    assert path.name in text or path.stem in text, f"bench/results/{path.name} is read or cited by nothing"
