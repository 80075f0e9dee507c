"""Self-check quizzes: questions live in data/quizzes/NN_topic.json, answers are checked here.

A question is multiple choice (exactly one correct choice) or numeric (an answer within an
absolute tolerance). Every question carries an explanation, shown after an answer.
Schema of one question:
    {"id": str, "type": "choice", "question": str, "choices": [str, ...], "answer": int, "explanation": str}
    {"id": str, "type": "numeric", "question": str, "answer": float, "tolerance": float, "unit": str,
     "explanation": str}
"""

from __future__ import annotations

import json
from pathlib import Path

QUIZ_DIR = Path(__file__).resolve().parents[2] / "data" / "quizzes"


def validate_question(q: dict) -> None:
    """Raise ValueError naming the problem if a question breaks the schema."""
    where = f"question {q.get('id', '?')!r}"
    for key in ("id", "type", "question", "answer", "explanation"):
        if key not in q:
            raise ValueError(f"{where}: missing {key!r}")
    if not str(q["explanation"]).strip():
        raise ValueError(f"{where}: the explanation is empty")
    if q["type"] == "choice":
        choices = q.get("choices")
        if not isinstance(choices, list) or len(choices) < 2:
            raise ValueError(f"{where}: a choice question needs at least two choices")
        if len(set(choices)) != len(choices):
            raise ValueError(f"{where}: two choices are identical")
        if not isinstance(q["answer"], int) or not 0 <= q["answer"] < len(choices):
            raise ValueError(f"{where}: answer must be the index of exactly one choice (0..{len(choices) - 1})")
    elif q["type"] == "numeric":
        if not isinstance(q["answer"], (int, float)):
            raise ValueError(f"{where}: a numeric answer must be a number")
        if not isinstance(q.get("tolerance"), (int, float)) or q["tolerance"] <= 0:
            raise ValueError(f"{where}: a numeric question needs a tolerance > 0")
    else:
        raise ValueError(f"{where}: type {q['type']!r} is unknown: use 'choice' or 'numeric'")


def load_quiz(name: str) -> list[dict]:
    """Questions of quiz ``name`` (file data/quizzes/<name>.json), validated."""
    path = QUIZ_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in QUIZ_DIR.glob("*.json"))
        raise ValueError(f"quiz {name!r} not found: choose one of {', '.join(known)}")
    questions = json.loads(path.read_text())["questions"]
    ids = [q.get("id") for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"quiz {name!r}: question ids repeat")
    for q in questions:
        validate_question(q)
    return questions


def is_correct(q: dict, answer) -> bool:
    """True if ``answer`` (a choice index, or a number) is right for question ``q``."""
    if answer is None:
        return False
    if q["type"] == "choice":
        return answer == q["answer"]
    try:
        return abs(float(answer) - q["answer"]) <= q["tolerance"]
    except (TypeError, ValueError):
        return False


def show_quiz(name: str):
    """Render the quiz as ipywidgets: one block per question with a Check button."""
    import ipywidgets as w
    from IPython.display import display

    blocks = []
    for n, q in enumerate(load_quiz(name), 1):
        title = w.HTML(f"<b>Q{n}.</b> {q['question']}")
        if q["type"] == "choice":
            field = w.RadioButtons(options=[(c, i) for i, c in enumerate(q["choices"])], value=None,
                                   layout=w.Layout(width="auto"))
        else:
            field = w.FloatText(description=q.get("unit", ""), value=None)
        button = w.Button(description="Check")
        feedback = w.HTML()

        def on_click(_, q=q, field=field, feedback=feedback):
            ok = is_correct(q, field.value)
            verdict = "<span style='color:green'>Correct.</span>" if ok else "<span style='color:#b00'>Not quite.</span>"
            feedback.value = f"{verdict} {q['explanation']}"

        button.on_click(on_click)
        blocks.append(w.VBox([title, field, w.HBox([button]), feedback]))
    box = w.VBox(blocks)
    display(box)
    return box
