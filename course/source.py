"""Open the engine inside a notebook: print a function's own source with its file and line.

Where a notebook teaches a mechanism it shows the engine's code for it, ``show_source(Engine.step)``,
so the learner reads the lines that run rather than a description of them. The file is named
relative to the repository (``minispec/core/engine.py:150``), the same anchor docs/architecture.md's
reading order uses. Invariant: what is printed is the code that runs (``inspect`` reads the loaded
module), never a copy. Used in notebooks 00, 02, 03 and 04.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import minispec

REPO = Path(minispec.__file__).resolve().parent.parent


def source_location(obj) -> tuple[str, int]:
    """(file relative to the repository, line of its ``def`` or ``class``) of a function, method
    or class: the anchor docs/architecture.md writes (decorators sit above it).

    Raises: TypeError for an object without Python source (a builtin, an instance).
    """
    target = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    path = Path(inspect.getsourcefile(target)).resolve()
    lines, line = inspect.getsourcelines(target)
    line += next((i for i, text in enumerate(lines) if not text.lstrip().startswith("@")), 0)
    try:
        name = path.relative_to(REPO).as_posix()
    except ValueError:  # outside the repository: the file's name alone, never a machine path
        name = path.name
    return name, line


def source_text(obj, start: str | None = None, stop: str | None = None) -> str:
    """The numbered source of ``obj`` under a ``file:line  name`` heading. ``start`` / ``stop``:
    text of the first / last line to show (the first line holding it); None shows all."""
    target = inspect.unwrap(obj.fget if isinstance(obj, property) else obj)
    name, _ = source_location(target)
    lines, first = inspect.getsourcelines(target)
    begin = next((i for i, line in enumerate(lines) if start in line), 0) if start else \
        next((i for i, line in enumerate(lines) if not line.lstrip().startswith("@")), 0)
    end = next((i for i, line in enumerate(lines) if i >= begin and stop in line), len(lines) - 1) if stop \
        else len(lines) - 1
    title = getattr(target, "__qualname__", getattr(target, "__name__", repr(target)))
    body = [f"{first + i:5d} | {lines[i].rstrip()}" for i in range(begin, end + 1)]
    return "\n".join([f"{name}:{first + begin}  {title}"] + body)


def show_source(obj, start: str | None = None, stop: str | None = None) -> None:
    """Print the engine's own code for ``obj`` (a function, method or class) with its file and
    line numbers; ``start`` / ``stop`` narrow it to the lines from the one holding ``start`` to
    the one holding ``stop``."""
    print(source_text(obj, start, stop))
