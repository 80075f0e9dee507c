"""One entry point for every benchmark: ``python -m bench`` lists them, ``python -m bench NAME
[ARGS]`` runs one (``python -m bench NAME --help`` for its flags), from the repository root.

Each script lives in the folder of the question it answers and still runs on its own
(``python bench/GROUP/NAME.py``); results go to bench/results/, described in bench/README.md.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the questions, in the order bench/README.md answers them
QUESTIONS = {
    "course": "the course's numbers: crossovers, claims, the notebooks' time budget, the JSON route",
    "peers": "minispec beside transformers, llama.cpp and the grammar libraries; where a step's time goes",
    "sim": "the simulator against the engine and against published GPU tables",
    "gpu": "the prepared GPU run and the engine mode fitted from it",
    "draft": "the shipped draft: acceptance, its confidence cut, training pilots",
}


def scripts() -> dict[str, Path]:
    """Every benchmark script by name: bench/<question>/<name>.py."""
    return {p.stem: p for q in QUESTIONS for p in sorted((HERE / q).glob("*.py")) if p.stem != "__init__"}


def summary(path: Path) -> str:
    """The first line of a script's docstring."""
    text = path.read_text(encoding="utf-8").lstrip()
    return text.strip('"').splitlines()[0].strip() if text.startswith('"""') else ""


def listing() -> str:
    by_name = scripts()
    lines = ["usage: python -m bench NAME [ARGS]   (python -m bench NAME --help)", ""]
    for q, what in QUESTIONS.items():
        lines.append(f"{q}: {what}")
        lines += [f"  {p.stem:<20} {summary(p)}" for p in by_name.values() if p.parent.name == q]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    name, rest = argv[0].removesuffix(".py"), argv[1:]
    path = scripts().get(name)
    if path is None:
        print(f"bench: no benchmark named {name!r}; choose one of: {', '.join(sorted(scripts()))}",
              file=sys.stderr)
        return 2
    # as `python bench/<question>/<name>.py` would: its folder first on the path, its own argv
    # (run_path sets argv[0] to the script's path)
    sys.path.insert(0, str(path.parent))
    sys.argv = [str(path), *rest]
    runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
