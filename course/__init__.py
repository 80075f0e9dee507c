"""Helpers for the notebooks: set-up, quizzes, exercise checks, plots and explorers, and
``show_source`` (course/source.py), which prints the engine's own code for a mechanism.

Kept out of the engine so the engine stays free of notebook concerns. ``MINISPEC_FAST=1`` (read
here only) shrinks notebook workloads so CI can execute every notebook quickly. When
``MINISPEC_RECORD`` names a file, ``headline`` and the headless explorers append what they show
to it (bench/course/course_budget.py reads it: quiet and busy runs side by side, redraw times).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time

from course.plots import fit_titles
from course.threads import pick_threads
from course.source import show_source  # noqa: F401 (the notebooks' import)
from minispec.cost.hardware import available_hardware, load_hardware
from minispec.models.machine import check_isa_variables, format_machine_card, machine_card
from minispec.sim.profile import machine_name


def fast_mode() -> bool:
    """True when MINISPEC_FAST=1: notebooks use smaller workloads (CI, quick checks)."""
    return os.environ.get("MINISPEC_FAST") == "1"


class WrappedOutput:
    """A text stream that wraps lines longer than ``width`` at spaces before writing them to
    ``stream``, continuation lines indented, so a notebook's printed paragraphs fit its output area
    (JupyterLab otherwise breaks them mid-word). Lines that look like tables (a " | ", or columns
    aligned with runs of spaces) and lines without spaces are written as they are. Everything else is the
    wrapped stream's."""

    def __init__(self, stream, width: int = 100):
        self.stream = stream
        self.width = width
        self._pending = ""

    def _fit(self, line: str) -> str:
        import textwrap

        body = line.strip()
        if len(line) <= self.width or " | " in line or " " not in body or "   " in body:  # a table's row
            return line
        indent = line[: len(line) - len(line.lstrip())]
        return textwrap.fill(line, self.width, subsequent_indent=indent + "  ", break_long_words=False,
                             break_on_hyphens=False)

    def write(self, text: str) -> int:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            self.stream.write(self._fit(line) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write(self._fit(self._pending))
            self._pending = ""
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def setup(seed: int = 0) -> dict:
    """Seed torch, pick the device and the CPU threads (one fewer while another program is busy on a
    core: :func:`course.threads.pick_threads`), and print versions and the machine card (which weight
    formats run natively here: minispec/models/machine.py). Returns {"device", "fast", "threads"}.
    Raises ValueError for a bad MINISPEC_THREADS or instruction-set variable.
    In a notebook kernel, printed lines are wrapped to the output area from here on
    (:class:`WrappedOutput`), and plot titles to their axes (:func:`course.plots.fit_titles`)."""
    import sys

    import torch
    import transformers

    if "ipykernel" in sys.modules and not isinstance(sys.stdout, WrappedOutput):
        sys.stdout = WrappedOutput(sys.stdout)
    fit_titles()  # plot titles wrapped to their axes: computed titles never run into a neighbour's

    check_isa_variables()  # a misspelt instruction-set switch would be ignored without a word
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    threads, why = pick_threads() if device == "cpu" else (torch.get_num_threads(), "")
    info = {"device": device, "fast": fast_mode(), "threads": threads}
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device} ({name}), "
          f"{threads} CPU threads, fast mode {'on' if info['fast'] else 'off'}")
    print(format_machine_card(machine_card(device)))
    if "busy" in why:
        print(f"Note: {why}. Numbers measured now are slower than on a quiet machine; the notebooks' "
              "verdicts say when the rounds disagree.")
    return info


def record(kind: str, **data) -> None:
    """Append ``{"kind": kind, **data}`` as one JSON line to the file MINISPEC_RECORD names, if any."""
    path = os.environ.get("MINISPEC_RECORD")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **data}) + "\n")


def headline(text: str) -> str:
    """A measured headline (a plot title or a verdict computed from the data): returned as is, and
    recorded for bench/course/course_budget.py. Returns ``text``."""
    record("headline", text=text)
    return text


def show_table(rows: list[dict], caption: str | None = None) -> str:
    """Show ``rows`` (dicts with the same keys, the keys as the header) as an HTML table in a
    notebook, which fits the output area and scrolls sideways instead of wrapping every row; outside
    a kernel (tests, scripts) print them as text. Values are shown as given: format numbers first.
    Returns the text form. Raises ValueError for no rows."""
    import html
    import sys

    if not rows:
        raise ValueError("show_table needs at least one row")
    keys = list(rows[0])
    widths = {k: max(len(str(k)), *(len(str(r.get(k, ""))) for r in rows)) for k in keys}
    lines = [" | ".join(f"{k:>{widths[k]}}" for k in keys)]
    lines += [" | ".join(f"{str(r.get(k, '')):>{widths[k]}}" for k in keys) for r in rows]
    text = "\n".join(([caption] if caption else []) + lines)
    if "ipykernel" in sys.modules:
        from IPython.display import HTML, display

        cell = lambda tag, v: f"<{tag} style='text-align:right'>{html.escape(str(v))}</{tag}>"
        body = "".join("<tr>" + "".join(cell("td", r.get(k, "")) for k in keys) + "</tr>" for r in rows)
        display(HTML((f"<p>{html.escape(caption)}</p>" if caption else "") + "<table><thead><tr>"
                     + "".join(cell("th", k) for k in keys) + f"</tr></thead><tbody>{body}</tbody></table>"))
    else:
        print(text)
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


def explorer_hardware() -> list[str]:
    """The devices an explorer offers: every preset in data/hardware/, and "this" only once
    ``python -m minispec profile`` has fitted this machine (the file names the machine it profiled;
    a file profiled elsewhere is not this machine's)."""
    names = [h for h in available_hardware() if h != "this"]
    try:
        fit = load_hardware("this").fit or {}
    except ValueError:
        return names
    return names + (["this"] if fit.get("device") == machine_name() else [])


def headless() -> bool:
    """True when MINISPEC_HEADLESS=1: notebooks run with no one to move a slider (``make test``)."""
    return os.environ.get("MINISPEC_HEADLESS") == "1"


def interact(fn, **widgets):
    """``ipywidgets.interact(fn, **widgets)``: an explorer with one control per argument.

    A value ``fn`` cannot draw for (it raises) prints one line naming the values and the reason,
    never a traceback, and the next move redraws as usual. Headless (MINISPEC_HEADLESS=1), ``fn``
    is called once with each control's starting value and no widget is shown: the plot is still
    drawn and checked, but the notebook executor never waits on interact's output widget, which
    sometimes blocks it (jupyter/nbclient issue #312). With MINISPEC_EXPLORE_EXTREMES=1 as well
    (the test run), every control is then also set, one at a time, to its first and last value
    (a slider's ends, a dropdown's first and last option), those plots closed unseen; one that
    raises fails the cell, so a control that offers a value its explorer cannot draw is caught.
    Returns what ipywidgets.interact returns, or headless what ``fn`` returns.
    """
    import functools
    import inspect

    import ipywidgets

    if not headless():
        @functools.wraps(fn)
        def safe(**values):
            try:
                return fn(**values)
            except Exception as exc:  # one line the learner can act on, not 60 lines of traceback
                shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
                print(f"This explorer cannot draw {shown}: {type(exc).__name__}: {exc}. "
                      "Move a control back or pick another value.")
        shown = ipywidgets.interact(safe, **widgets)
        # labels in full ("max_concurrency", not "max_conc...")
        for control in getattr(getattr(shown, "widget", None), "children", ()):
            if isinstance(getattr(control, "style", None), ipywidgets.SliderStyle):
                control.style.description_width = "initial"
        return shown
    params = inspect.signature(fn).parameters
    controls = {}
    for name, abbrev in widgets.items():
        default = params[name].default if name in params else inspect.Parameter.empty
        controls[name] = abbrev if isinstance(abbrev, ipywidgets.ValueWidget) else \
            ipywidgets.interactive.widget_from_abbrev(abbrev, default)
    values = {name: widget.value for name, widget in controls.items()}
    start = time.perf_counter()
    result = fn(**values)
    record("explorer", name=getattr(fn, "__name__", "explorer"), seconds=time.perf_counter() - start)
    if os.environ.get("MINISPEC_EXPLORE_EXTREMES") == "1":
        explore_extremes(fn, controls, values)
    return result


def control_extremes(widget) -> list:
    """A control's first and last value: a slider's min and max, a selection's first and last option."""
    options = getattr(widget, "options", None)
    if options is not None:
        labels = list(options)
        values = [o[1] if isinstance(o, tuple) else o for o in labels]
        return [values[0], values[-1]] if values else []
    if hasattr(widget, "min") and hasattr(widget, "max"):
        return [widget.min, widget.max]
    if isinstance(widget.value, bool):
        return [False, True]
    return []


def explore_extremes(fn, controls: dict, values: dict) -> None:
    """Call ``fn`` with each control at each of its extremes, the others at their starting values;
    the figures those calls draw are closed unshown. Raises the first call's error, naming the
    control and value (see :func:`interact`)."""
    import matplotlib.pyplot as plt

    show = plt.show
    plt.show = lambda *a, **k: None
    try:
        for name, widget in controls.items():
            for value in control_extremes(widget):
                start = time.perf_counter()
                try:
                    fn(**{**values, name: value})
                except Exception as exc:
                    raise RuntimeError(f"explorer {getattr(fn, '__name__', '')!r} cannot draw "
                                       f"{name}={value!r}: {type(exc).__name__}: {exc}") from exc
                finally:
                    plt.close("all")
                record("explorer_extreme", name=getattr(fn, "__name__", "explorer"), control=name,
                       value=repr(value), seconds=time.perf_counter() - start)
    finally:
        plt.show = show
