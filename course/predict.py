"""Predict, then reveal: the learner commits a number or a choice before a headline measurement runs,
and the notebook sets it against what the run measured, with the run's noise band.

``predict(key, question, ...)`` shows a widget whose Commit button records the prediction (in memory,
per notebook and key); ``reveal(key, measured, ...)`` prints the prediction against the measurement
and whether it held; ``score()`` closes the notebook with one line. The invariant: nothing is graded on
noise. A number holds inside the rounds' range widened by a tolerance (inside a range whose rounds
disagree on the direction it is not judged; beyond even that range it is missed); a direction
counts only where every round agrees beyond the dead zone (``direction_of``, the rule notebook 03's
re-timing exercise judges by), and what the rounds leave open is "not judged", never "missed". Bad
input (nothing entered, text in a number field, a negative or non-finite number, no choice picked)
is one line and records nothing. Nothing here waits for input: Run All goes through, and a
measurement revealed with no prediction says "no prediction recorded" beside the measurement.

Taught in every notebook, 00 to 10, at its headline measurements.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as w
from IPython.display import display

from course import headless, record
from course.noise import DEAD_ZONE, Verdict
from course.quiz import markup

HELD, MISSED, NOT_JUDGED, NO_PREDICTION = "held", "missed", "not judged", "no prediction"
KINDS = ("number", "choice")


def direction_of(verdict: Verdict, higher: str = "higher", lower: str = "lower",
                 same: str | None = None) -> str | None:
    """The direction every round of ``verdict`` agrees on beyond the dead zone, in the caller's words:
    ``higher`` or ``lower``; ``same`` where every round sat inside the dead zone (when a word for it is
    given). None where the rounds leave it open ("probably", "noisy", "one round", or a tie with no
    word): a prediction about it can then be neither held nor missed."""
    if verdict.finding == "higher":
        return higher
    if verdict.finding == "lower":
        return lower
    return same if verdict.finding == "tie" else None


def _number(x: float) -> str:
    """A number as a learner reads it: three significant figures, thousands separated, no exponent."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def parse_number(raw, unit: str | None = None) -> tuple[float | None, str]:
    """``(value, "")`` when ``raw`` is a finite number >= 0 (a number, or text such as "2.5", "2.5x" or
    "8 tokens" where the trailing word is ``unit``); ``(None, why)`` otherwise, ``why`` saying what was
    wrong in a few words (nothing entered, not a number, not finite, negative)."""
    if isinstance(raw, bool):
        return None, f"{raw!r} is not a number"
    if isinstance(raw, (int, float)):
        value, text = float(raw), _number(raw) if math.isfinite(raw) else str(raw)
    else:
        text = "" if raw is None else str(raw).strip()
        if not text:
            return None, "nothing entered"
        body = text[: -len(unit)].strip() if unit and text.lower().endswith(unit.lower()) else text
        try:
            value = float(body)
        except ValueError:
            return None, f"{text!r} is not a number"
    if not math.isfinite(value):
        return None, f"{text!r} is not a finite number"
    if value < 0:
        return None, f"{text!r} is negative, and nothing measured here can be"
    return value, ""


@dataclass
class Prediction:
    """One question of a notebook and what became of it.

    Attributes:
        key: the name ``reveal`` uses; question: the text shown; kind: "number" or "choice".
        choices: a choice's options (None for a number); unit: written after a number ("x", "tokens").
        value: the committed prediction (a float, or one of ``choices``), None until committed.
        outcome: None until revealed, then HELD, MISSED, NOT_JUDGED or NO_PREDICTION.
    """

    key: str
    question: str
    kind: str = "number"
    choices: tuple[str, ...] | None = None
    unit: str | None = None
    value: float | str | None = None
    outcome: str | None = None

    def shown(self, value) -> str:
        """``value`` as the learner reads it: "1.5x", "8 tokens", "faster"."""
        if isinstance(value, str):
            return value
        unit = self.unit or ""
        return _number(value) + (unit if unit in ("", "x", "%") else f" {unit}")


class Predictions:
    """The predictions of one notebook, by key, in the order asked.

    ``ask`` registers a question (asking again starts it afresh), ``commit`` records an answer,
    ``reveal`` judges it against the measurement and ``score_line`` sums up; each returns the line a
    learner reads (the module's functions print it).
    """

    def __init__(self, notebook: str):
        self.notebook = notebook
        self.items: dict[str, Prediction] = {}

    def ask(self, key: str, question: str, kind: str = "number", choices=None, unit: str | None = None
            ) -> Prediction:
        """Register ``question`` under ``key``. Raises ValueError for an unknown kind, a choice with
        fewer than two distinct options, or a number given choices."""
        if kind not in KINDS:
            raise ValueError(f"predict({key!r}): kind must be one of {KINDS}, got {kind!r}")
        if kind == "choice" and (not choices or len(set(choices)) != len(choices) or len(choices) < 2):
            raise ValueError(f"predict({key!r}): a choice needs two or more distinct choices, got "
                             f"{choices!r}")
        if kind == "number" and choices:
            raise ValueError(f"predict({key!r}): a number takes no choices; use kind='choice'")
        self.items[key] = Prediction(key, question, kind, tuple(choices) if choices else None, unit)
        return self.items[key]

    def commit(self, key: str, raw) -> str:
        """Record ``raw`` as the prediction for ``key`` when it is a valid answer; one line either way.
        A bad answer, or one after the reveal, records nothing (an earlier prediction stands)."""
        p = self.items.get(key)
        if p is None:
            return f"No question '{key}' was asked in {self.notebook}: run its predict cell first."
        if p.outcome is not None:
            return (f"'{key}' is already revealed: run its predict cell again to predict afresh. "
                    "Nothing was recorded.")
        if p.kind == "choice":
            value, why = (raw, "") if raw in p.choices else (None, "no choice picked" if raw in (None, "")
                                                              else f"{raw!r} is not one of the choices")
        else:
            value, why = parse_number(raw, p.unit)
        if value is None:
            hint = "pick one" if p.kind == "choice" else "type a number such as 2.5"
            kept = f" (your earlier prediction, {p.shown(p.value)}, stands)" if p.value is not None else ""
            return f"'{key}': {why}: {hint}, then Commit. Nothing was recorded{kept}."
        p.value = value
        return f"Recorded for '{key}': {p.shown(value)}. Now run the measurement."

    def reveal(self, key: str, measured, band=None, tolerance: float = 0.2, detail: str | None = None,
               over: str = "the rounds") -> str:
        """Judge the prediction for ``key`` against ``measured`` (see :func:`reveal`); the line."""
        p = self.items.get(key)
        if p is None:  # a predict cell skipped: still show the measurement
            kind = "choice" if isinstance(measured, str) else "number"
            p = self.items[key] = Prediction(key, key, kind)
        if p.kind == "choice":
            got, text, why = _choice_measured(p, measured)
            judged, holds = got is not None, p.value == got
            because = "every round agrees beyond the dead zone" if isinstance(measured, Verdict) else ""
            reasons = {HELD: because, MISSED: because or f"the run measured {got}"}
        else:
            lo, hi, text, why, of = _number_measured(p, measured, band, over)
            judged = lo is not None
            lo_w, hi_w = (lo / (1 + tolerance), hi * (1 + tolerance)) if judged else (0.0, 0.0)
            holds = judged and p.value is not None and lo_w <= p.value <= hi_w
            near = (f"within a factor {1 + tolerance:g}" if tolerance >= 0.5
                    else f"give or take {tolerance:.0%}")
            what = f"{_number(lo_w)}-{p.shown(hi_w)}, {of} {near}"
            reasons = {HELD: f"inside {what}", MISSED: f"outside {what}"}
        text += f" ({detail})" if detail else ""
        if p.value is None:
            p.outcome = NO_PREDICTION
            whom = ("headless run: nobody fills the widget" if headless()
                    else "nothing was committed before the measurement ran")
            line = f"'{key}': no prediction recorded ({whom}). Measured: {text}."
        else:
            p.outcome = (HELD if holds else MISSED) if judged else NOT_JUDGED
            if p.outcome == HELD and why:  # inside a range whose rounds disagree on the direction: no finding
                p.outcome = NOT_JUDGED
            reasons[NOT_JUDGED] = f"{why}, so this run's noise cannot count against you"
            reason = reasons[p.outcome]
            said = p.outcome[0].upper() + p.outcome[1:] + (f": {reason}" if reason else "")
            line = f"'{key}': you predicted {p.shown(p.value)}; measured {text}. {said}."
        record("prediction", notebook=self.notebook, key=key, outcome=p.outcome)
        return line

    def score_line(self) -> str:
        """One line: how many revealed predictions held, how many the noise left open, and how many
        measurements had none (or predictions still waiting for their measurement)."""
        done = [p for p in self.items.values() if p.outcome is not None]
        made = [p for p in done if p.outcome != NO_PREDICTION]
        held = sum(p.outcome == HELD for p in made)
        unjudged = sum(p.outcome == NOT_JUDGED for p in made)
        line = (f"Your predictions in {self.notebook}: {held} of {len(made)} predictions held; {unjudged} "
                "could not be judged on this run's noise")
        if len(done) > len(made):
            n = len(done) - len(made)
            line += f"; {n} measurement{'s' if n != 1 else ''} revealed with no prediction recorded"
        waiting = sum(p.outcome is None and p.value is not None for p in self.items.values())
        if waiting:
            line += f"; {waiting} committed, not revealed yet"
        return line + "."


def _choice_measured(p: Prediction, measured) -> tuple[str | None, str, str]:
    """(the measured choice or None where the run leaves it open, the text shown, why not judged)."""
    if isinstance(measured, Verdict):
        if not p.choices or len(p.choices) not in (2, 3):
            raise ValueError(f"reveal({p.key!r}) with a Verdict needs the choices (higher, lower[, same])")
        got = direction_of(measured, *p.choices)
        why = {"one round": "one round gives no spread to judge by",
               "tie": "every round sat inside the dead zone, and no choice says 'no difference'"}.get(
            measured.finding, f"the rounds do not agree on a direction beyond the {DEAD_ZONE:.0%} dead zone")
        return got, measured.text(p.choices[0], p.choices[1]), "" if got is not None else why
    if measured is None:
        return None, "not settled on this run", "this run did not settle it"
    if p.choices and measured not in p.choices:
        raise ValueError(f"reveal({p.key!r}): measured {measured!r} is not one of {p.choices}")
    return measured, str(measured), ""


def _number_measured(p: Prediction, measured, band, over: str = "the rounds"
                     ) -> tuple[float | None, float | None, str, str, str]:
    """(the range a prediction is judged against, or Nones where the run gives none; the text shown;
    why not judged; what the range is). ``band``: None (a value without noise), (lo, hi), or a
    relative spread."""
    rounds = f"the range over {over}"
    if measured is None:
        return None, None, "nothing on this run", "this run measured nothing to judge by", ""
    if isinstance(measured, Verdict):
        if measured.finding == "one round":
            return None, None, measured.spread_text(), "one round gives no spread to judge by", ""
        why = ("the rounds disagree on the direction, so landing inside their range shows nothing"
               if measured.finding == "noisy" else "")
        return measured.low, measured.high, measured.spread_text(), why, rounds
    value = float(measured)
    if band is None:
        return value, value, p.shown(value), "", "the measurement"
    if isinstance(band, (int, float)):
        if band < 0:
            raise ValueError(f"reveal({p.key!r}): a spread must be >= 0, got {band}")
        lo, hi = value * (1 - band), value * (1 + band)
        return lo, hi, f"{p.shown(value)} (give or take this run's {band:.0%} spread)", "", "that spread"
    lo, hi = sorted(float(b) for b in band)
    text = p.shown(value) + ("" if lo == hi else f" ({_number(lo)}-{_number(hi)} over {over})")
    return min(lo, value), max(hi, value), text, "", rounds if lo < hi else "the measurement"


_BOOKS: dict[str, Predictions] = {}


def current_notebook() -> str:
    """The running notebook's name: Jupyter's server names a kernel's notebook in JPY_SESSION_NAME
    (ipykernel reads it too); "this notebook" where nothing does (nbclient, a script)."""
    path = os.environ.get("JPY_SESSION_NAME")
    return Path(path).stem if path else "this notebook"


def book(notebook: str | None = None) -> Predictions:
    """The predictions of ``notebook`` (default: the running one), kept for the kernel's life."""
    name = notebook or current_notebook()
    return _BOOKS.setdefault(name, Predictions(name))


def predict(key: str, question: str, kind: str = "number", choices=None, unit: str | None = None,
            notebook: str | None = None):
    """Ask ``question`` before the measurement runs: a field for a number (``unit`` after it) or a
    button per choice, and a Commit button that records the answer under ``key`` (see
    ``Predictions.commit`` for what it refuses). Running the cell again starts the question afresh.
    Headless (MINISPEC_HEADLESS=1) it prints the question and shows no widget.
    Returns the ipywidgets.VBox, or None headless. Raises ValueError as ``Predictions.ask``."""
    predictions = book(notebook)
    predictions.ask(key, question, kind, choices, unit)
    if headless():
        print(f"Predict ({key}): {question} [headless run: nobody fills the widget; the reveal below "
              "shows the measurement]")
        return None
    title = w.HTML(f"<b>Predict first</b> ({html.escape(key)}): {markup(question)}")
    if kind == "choice":
        field = w.RadioButtons(options=list(choices), value=None, layout=w.Layout(width="auto"))
        row = field
    else:  # Text, not FloatText: an empty FloatText reads as 0.0 and would be recorded as a prediction
        field = w.Text(placeholder="a number", layout=w.Layout(width="10em"))
        row = w.HBox([field, w.Label(unit or "")])
    button, said = w.Button(description="Commit"), w.Label()
    button.on_click(lambda _: setattr(said, "value", predictions.commit(key, field.value)))
    box = w.VBox([title, row, w.HBox([button, said])])
    display(box)
    return box


def reveal(key: str, measured, band=None, tolerance: float = 0.2, detail: str | None = None,
           over: str = "the rounds", notebook: str | None = None) -> str:
    """Print the prediction for ``key`` against ``measured`` and whether it held; return the outcome.

    Args:
        measured: for a number, a value >= 0, a ``course.noise.Verdict`` (its median ratio and the
            rounds' range; a single round is not judged) or None (nothing measured: not judged); for a
            choice, the measured choice, None where the run leaves it open, or a Verdict read with
            :func:`direction_of` and the choices (higher, lower[, no difference]) in that order.
        band: a number's noise: None (a run without noise: the simulator, a count), (lo, hi) over
            the rounds, or a relative spread such as 0.12 (the value give or take 12%).
        tolerance: a number holds inside the band widened by this fraction (0.2: lo / 1.2 to
            hi x 1.2; 1.0: within a factor 2).
        detail: the numbers behind a measured choice, shown beside it.
        over: what a (lo, hi) band spans, for the text ("the rounds"; "the four requests").
    Returns: HELD, MISSED, NOT_JUDGED or NO_PREDICTION. Raises ValueError for a measured choice not
    among the choices or a negative spread.
    """
    predictions = book(notebook)
    print(predictions.reveal(key, measured, band, tolerance, detail, over))
    return predictions.items[key].outcome


def score(notebook: str | None = None) -> str:
    """Print and return the notebook's one-line score (``Predictions.score_line``)."""
    line = book(notebook).score_line()
    print(line)
    return line
