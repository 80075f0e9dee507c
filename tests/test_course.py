"""Course material: quiz files are well formed, checks pass solutions and fail typical wrong answers,
and notebooks are committed without outputs."""

import json
from pathlib import Path

import pytest

from minispec.course import exercises as ex
from minispec.course.checks import FAIL, NOT_ATTEMPTED, PASS, check_number, run_check
from minispec.course.quiz import QUIZ_DIR, is_correct, load_quiz, validate_question

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted(QUIZ_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_quiz_files_are_valid(path):
    questions = load_quiz(path.stem)
    assert len(questions) >= 3
    for q in questions:
        right = q["answer"]
        assert is_correct(q, right)
        wrong = (right + 1) % len(q["choices"]) if q["type"] == "choice" else right + 2 * q["tolerance"] + 1
        assert not is_correct(q, wrong)


def test_every_notebook_has_a_quiz():
    notebooks = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    quizzes = {p.stem for p in QUIZ_DIR.glob("*.json")}
    assert notebooks and all(n in quizzes for n in notebooks), set(notebooks) - quizzes


@pytest.mark.parametrize("bad, message", [
    ({"id": "x", "type": "choice", "question": "?", "choices": ["a", "b"], "answer": 2, "explanation": "e"},
     "index of exactly one choice"),
    ({"id": "x", "type": "numeric", "question": "?", "answer": 1.0, "explanation": "e"}, "tolerance"),
    ({"id": "x", "type": "choice", "question": "?", "choices": ["a", "a"], "answer": 0, "explanation": "e"},
     "identical"),
    ({"id": "x", "type": "choice", "question": "?", "choices": ["a", "b"], "answer": 0, "explanation": " "},
     "explanation is empty"),
    ({"id": "x", "type": "essay", "question": "?", "answer": 0, "explanation": "e"}, "unknown"),
])
def test_quiz_validation_rejects_bad_questions(bad, message):
    with pytest.raises(ValueError, match=message):
        validate_question(bad)


def test_checks_never_raise():
    def broken():
        raise ZeroDivisionError("oops")

    assert run_check("x", broken, quiet=True) == FAIL
    assert run_check("x", lambda: (_ for _ in ()).throw(NotImplementedError()), quiet=True) == NOT_ATTEMPTED
    assert check_number("x", None, 3.0, quiet=True) == NOT_ATTEMPTED
    assert check_number("x", "not a number", 3.0, quiet=True) == FAIL
    assert check_number("x", 3.05, 3.0, quiet=True) == PASS


def test_exercise_checks_pass_references_and_fail_wrong_answers():
    assert ex.check_00_roofline(25e9 / 5.4e8, 5.4e8, quiet=True) == PASS
    assert ex.check_00_roofline(5.4e8 / 25e9, 5.4e8, quiet=True) == FAIL
    assert ex.check_01_ridge(ex.ridge_point_tokens(1e15, 3e12, 2), 1e15, 3e12, 2, quiet=True) == PASS
    assert ex.check_01_ridge(1e15 / (2 * 3e12), 1e15, 3e12, 2, quiet=True) == FAIL  # bytes per weight forgotten
    assert ex.check_02_static_waste(ex.static_batching_slot_steps, quiet=True) == PASS
    assert ex.check_03_prefill_steps(ex.prefill_steps, quiet=True) == PASS
    assert ex.check_04_expected_tokens(ex.expected_tokens_per_step, quiet=True) == PASS
    assert ex.check_04_greedy_verify(ex.reference_greedy_verify, quiet=True) == PASS
    assert ex.check_04_greedy_verify(lambda d, t: d, quiet=True) == FAIL


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").rglob("*.ipynb")), ids=lambda p: p.name)
def test_notebooks_are_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and not cell.get("execution_count"), f"{path.name} has outputs"
