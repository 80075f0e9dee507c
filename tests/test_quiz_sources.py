"""Every figure a quiz explanation quotes from a run is the run's (issue 44, item 1): the quoted text
is found in the committed result it comes from, or recomputed here from the cost model, so a change
to the cost model or a rerun of the course fails this test instead of misleading a learner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from minispec.course.quiz import load_quiz
from minispec.sim import load_hardware
from minispec.sim.costmodel import CostModel
from minispec.sim.modelspec import load_model_spec

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


def explanation(notebook: str, qid: str) -> str:
    return next(q["explanation"] for q in load_quiz(notebook) if q["id"] == qid)


def headline_of(notebook: str) -> str:
    """Every headline the committed quiet course run printed for ``notebook``."""
    rows = json.loads((RESULTS / "course_headlines.json").read_text())["rows"]
    return "\n".join(r["quiet"] for r in rows if r["notebook"] == notebook)


def verify_ratio(batch: int, k: int = 4, context: int = 1024) -> float:
    """Notebook 01's curve: a k-draft verify step over a plain step, H100 cost model, Llama-3-8B."""
    cost = CostModel(load_hardware("h100"), load_model_spec("llama-3-8b"))
    rows = batch * (k + 1)
    return (cost.forward_time_s(rows, rows, rows * context, batch * context, batch)
            / cost.forward_time_s(batch, batch, batch * context, batch * context, batch))


def test_mb3_quotes_the_verify_curve_of_notebook_01():
    text = explanation("01_decode_is_memory_bound", "mb-3")
    at_256, at_64 = f"{verify_ratio(256):.2f}x", f"{verify_ratio(64):.2f}x"
    assert f"{at_256} a plain step at batch 256" in text and f"the curve reads {at_64}" in text
    assert f"{at_256} at batch 256" in headline_of("01_decode_is_memory_bound")  # the committed run printed it
    assert verify_ratio(8) <= 1.1 < verify_ratio(16), "the text says the curve leaves 1.1x after batch 8"


def test_lab1_quotes_the_packed_h100_step_split_of_notebook_09():
    text, run = explanation("09_packed_device_lab", "lab-1"), headline_of("09_packed_device_lab")
    step = re.search(r"decode step from ([\d.]+) to ([\d.]+) ms: the draft's forwards added ([\d.]+) ms and the "
                     r"verify rows ([\d.]+) ms", text)
    assert step, text
    before, after, draft, rows = step.groups()
    assert (f"on the packed H100 model a decode step took {before} -> {after} ms: the drafter's forwards added {draft} "
            f"ms, the verify rows {rows} ms") in run
    assert float(draft) > float(rows), "the explanation says the drafter costs most"


@pytest.mark.parametrize("notebook, qid, figure", [("06_what_speculation_costs", "sc-2", "4.5")])
def test_a_models_answer_is_not_quoted_as_a_measurement(notebook, qid, figure):
    """sc-2's 4.5 decode steps is its proportional model's answer; the explanation says the
    measurement in the notebook is usually lower and why, instead of presenting 4.5 as this CPU's."""
    text = explanation(notebook, qid)
    assert figure in text and "upper bound" in text and "measures what the verify cost on your CPU" in text
