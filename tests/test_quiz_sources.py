"""Every figure a quiz explanation quotes from a run is the run's (issue 44, item 1): the quoted text
is found in the committed result it comes from, or recomputed here from the cost model, so a change
to the cost model or a rerun of the course fails this test instead of misleading a learner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course.quiz import load_quiz
from minispec.sim import load_hardware
from minispec.cost.model import CostModel
from minispec.cost.modelspec import load_model_spec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def explanation(notebook: str, qid: str) -> str:
    return next(q["explanation"] for q in load_quiz(notebook) if q["id"] == qid)


def headline_of(notebook: str, runs: tuple[str, ...] = ("quiet",)) -> str:
    """Every headline the committed course runs (quiet, or also "busy") printed for ``notebook``."""
    rows = json.loads((RESULTS / "course_headlines.json").read_text())["rows"]
    return "\n".join(r[run] for r in rows if r["notebook"] == notebook for run in runs)


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
    # the H100 side is simulated, so both runs print the same split, where their CPU verdict lets the
    # sentence explain the ranks (a run whose CPU places are not settled prints no split)
    text, run = explanation("10_packed_device_lab", "lab-1"), headline_of("10_packed_device_lab", ("quiet", "busy"))
    step = re.search(r"decode step from ([\d.]+) to ([\d.]+) ms: the draft's forwards added ([\d.]+) ms and the "
                     r"verify rows ([\d.]+) ms", text)
    assert step, text
    before, after, draft, rows = step.groups()
    assert (f"H100 model a decode step took {before} -> {after} ms: the drafter's forwards added {draft} "
            f"ms, the verify rows {rows} ms") in run
    assert float(draft) > float(rows), "the explanation says the drafter costs most"


@pytest.mark.parametrize("notebook, qid, figure", [("06_what_speculation_costs", "sc-2", "4.5")])
def test_a_models_answer_is_not_quoted_as_a_measurement(notebook, qid, figure):
    """sc-2's 4.5 decode steps is its proportional model's answer; the explanation says the
    measurement in the notebook is usually lower and why, instead of presenting 4.5 as this CPU's."""
    text = explanation(notebook, qid)
    assert figure in text and "upper bound" in text and "measures what the verify cost on your CPU" in text


def test_sc3_quotes_the_tree_shapes_run():
    """sc-3's tree sizes, tokens per verify and speedups are bench/results/tree_shapes.json's."""
    rows = {r["shape"]: r for r in json.loads((RESULTS / "tree_shapes.json").read_text())["rows"]}
    text = next(q["question"] for q in load_quiz("06_what_speculation_costs") if q["id"] == "sc-3")
    small, big = rows["4/4/8"], rows["5/8/16"]
    assert (f"from about {small['mean_accepted_length']:.2f} to {big['mean_accepted_length']:.2f} tokens per verify, "
            f"and from about {small['speedup_vs_off']:.2f}x to {big['speedup_vs_off']:.2f}x spec off") in text


def test_sc1_quotes_tokens_per_verify_that_the_committed_course_run_measured():
    """sc-1's "about 2.0 tokens per verify against 1.5 for a chain of 2" is notebook 06's live run
    (bench/results/course_budget.json's headlines), to the one decimal the question gives."""
    text = next(q["question"] for q in load_quiz("06_what_speculation_costs") if q["id"] == "sc-1")
    tree, chain = map(float, re.search(r"emits about ([\d.]+) tokens per verify against ([\d.]+) for a chain", text).groups())
    heads = json.loads((RESULTS / "course_budget.json").read_text())["notebooks"]["06_what_speculation_costs"]
    measured = {}
    for line in heads["full"]["headlines"]:
        m = re.search(r"shipped draft, (chain k 2|tree 4/4/8), concurrency 1: .*mean accepted length ([\d.]+)", line)
        if m:
            measured[m.group(1)] = float(m.group(2))
    assert abs(measured["tree 4/4/8"] - tree) <= 0.1 and abs(measured["chain k 2"] - chain) <= 0.1, measured


def test_the_05_solution_quotes_the_user_fleet_table():
    """The 05 solution's figures (whether plain decoding keeps 150 tok/s per user, a plain step's time
    alone, up to how many users speculation keeps it, spec off against k 2 and k 4 at 128 users) are
    the exercise's own simulated table. It said "up to about two users, 6.6 ms" after the cost model
    gained its fixed step time, which this test caught."""
    import nbformat

    from course.exercises import user_fleet_table

    nb = nbformat.read(ROOT / "notebooks" / "solutions" / "05_messenger_vs_truck_solutions.ipynb", as_version=4)
    text = " ".join(" ".join(c.source for c in nb.cells if c.cell_type == "markdown").split())
    table = user_fleet_table()
    keeps = lambda ks: [c for (c, k), row in table.items() if k in ks and row["user_tok_s"] >= 150]
    assert not keeps({0}) and "plain decoding never keeps it" in text
    alone = table[(1, 0)]["user_tok_s"]
    assert f"a plain step takes about {1000 / alone:.1f} ms ({alone:.0f} tokens/s)" in text
    assert f"keeps the promise up to {max(keeps({2, 4}))} users" in text
    fleet = {k: table[(128, k)]["fleet_tok_s"] for k in (0, 2, 4)}
    assert abs(fleet[0] / fleet[2] - 1) < 0.05 and fleet[0] > fleet[4], fleet
