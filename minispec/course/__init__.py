"""Helpers for the notebooks: set-up, quizzes, exercise checks, plots and explorers, and
``show_source`` (minispec/course/source.py), which prints the engine's own code for a mechanism.

Kept out of the engine so the engine stays free of notebook concerns. ``MINISPEC_FAST=1`` (read
here only) shrinks notebook workloads so CI can execute every notebook quickly. When
``MINISPEC_RECORD`` names a file, ``headline`` and the headless explorers append what they show
to it (bench/course_budget.py reads it: quiet and busy runs side by side, redraw times).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time

from minispec.course.source import show_source  # noqa: F401 (the notebooks' import)


def fast_mode() -> bool:
    """True when MINISPEC_FAST=1: notebooks use smaller workloads (CI, quick checks)."""
    return os.environ.get("MINISPEC_FAST") == "1"


def setup(seed: int = 0) -> dict:
    """Seed torch, pick the device, and print versions. Returns {"device", "fast", "threads"}."""
    import torch
    import transformers

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {"device": device, "fast": fast_mode(), "threads": torch.get_num_threads()}
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device} ({name}), "
          f"{info['threads']} CPU threads, fast mode {'on' if info['fast'] else 'off'}")
    return info


def record(kind: str, **data) -> None:
    """Append ``{"kind": kind, **data}`` as one JSON line to the file MINISPEC_RECORD names, if any."""
    path = os.environ.get("MINISPEC_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **data}) + "\n")


def headline(text: str) -> str:
    """A measured headline (a plot title or a verdict computed from the data): returned as is, and
    recorded for bench/course_budget.py. Returns ``text``."""
    record("headline", text=text)
    return text


@contextlib.contextmanager
def quiet_engine_log(level: int = logging.ERROR):
    """Within the ``with`` block, the engine's "minispec" logger passes only messages at ``level``
    or above: for a cell that runs poor acceptance on purpose, where the engine's warning that
    speculation is not paying would only repeat what the cell sets out to show. The logger's
    previous level comes back on exit."""
    logger = logging.getLogger("minispec")
    before = logger.level
    logger.setLevel(level)
    try:
        yield logger
    finally:
        logger.setLevel(before)


def headless() -> bool:
    """True when MINISPEC_HEADLESS=1: notebooks run with no one to move a slider (``make test``)."""
    return os.environ.get("MINISPEC_HEADLESS") == "1"


def interact(fn, **widgets):
    """``ipywidgets.interact(fn, **widgets)``: an explorer with one control per argument.

    Headless (MINISPEC_HEADLESS=1), ``fn`` is called once with each control's starting value and
    no widget is shown: the plot is still drawn and checked, but the notebook executor never waits
    on interact's output widget, which sometimes blocks it (jupyter/nbclient issue #312).
    Returns what ipywidgets.interact returns, or headless what ``fn`` returns.
    """
    import inspect

    import ipywidgets

    if not headless():
        return ipywidgets.interact(fn, **widgets)
    params = inspect.signature(fn).parameters
    values = {}
    for name, abbrev in widgets.items():
        default = params[name].default if name in params else inspect.Parameter.empty
        widget = abbrev if isinstance(abbrev, ipywidgets.ValueWidget) else \
            ipywidgets.interactive.widget_from_abbrev(abbrev, default)
        values[name] = widget.value
    start = time.perf_counter()
    result = fn(**values)
    record("explorer", name=getattr(fn, "__name__", "explorer"), seconds=time.perf_counter() - start)
    return result
