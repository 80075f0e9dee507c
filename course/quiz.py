"""Self-check quizzes: questions live in data/quizzes/NN_topic.json, answers are checked here.

A question is multiple choice (exactly one correct choice) or numeric (an answer within an
absolute tolerance). Every question carries an explanation, shown only once an answer has been
checked. Schema of one question:
    {"id": str, "type": "choice", "question": str, "choices": [str, ...], "answer": int, "explanation": str}
    {"id": str, "type": "numeric", "question": str, "answer": float, "tolerance": float, "unit": str,
     "explanation": str, "inputs": {name: number, ...}, "formula": str}
"answer" of a choice question is the index of the correct choice in the stored list; the quiz shows
the choices in a shuffled order (``choice_order``) so that the position gives nothing away.
"inputs" and "formula" are optional: the formula is an arithmetic expression over the input names
(numbers, + - * / **, parentheses, min, max, ceil, floor) and must give the stored answer within the
tolerance, so a changed number in the question cannot leave a stale answer behind.
The running score (``QuizScore``) counts the latest checked answer of each question.
Taught alongside every notebook: notebooks/NN_topic.ipynb ends with ``show_quiz("NN_topic")``, and
each listing of the engine's code in it is followed by ``show_reading("NN_topic", "read-N")``.
"""

from __future__ import annotations

import ast
import html
import json
import math
import operator
import random
import re
from pathlib import Path

QUIZ_DIR = Path(__file__).resolve().parents[1] / "data" / "quizzes"

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.Pow: operator.pow}
_FUNCTIONS = {"min": min, "max": max, "ceil": math.ceil, "floor": math.floor}
_MAX_EXPONENT = 100  # keeps a typo like 10 ** 10 ** 10 from hanging the validation
_ALLOWED = "numbers, input names, + - * / **, parentheses and min(), max(), ceil(), floor()"


def evaluate_formula(formula: str, inputs: dict) -> float:
    """Value of the arithmetic expression ``formula`` with the names in ``inputs`` bound to numbers.

    Only numbers, names from ``inputs``, + - * / ** (unary + and - too), parentheses and calls of
    min, max, ceil and floor are allowed; nothing is executed, the parsed tree is walked.
    Returns the value as a float.
    Raises ValueError if the formula does not parse, uses anything else, names a missing input,
    divides by zero or overflows.
    """
    if not isinstance(formula, str) or not formula.strip():
        raise ValueError(f"formula {formula!r}: must be a non-empty string using {_ALLOWED}")
    try:
        tree = ast.parse(formula.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"formula {formula!r} is not an expression: {e.msg}") from None

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in inputs:
                raise ValueError(f"formula {formula!r} uses {node.id!r}, which is not an input; "
                                 f"inputs are: {', '.join(sorted(inputs)) or 'none'}")
            return inputs[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"formula {formula!r}: exponent {right} is larger than {_MAX_EXPONENT}")
            try:
                return _OPERATORS[type(node.op)](left, right)
            except (ZeroDivisionError, OverflowError) as e:
                raise ValueError(f"formula {formula!r} cannot be evaluated: {e}") from None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                and not node.keywords and node.args):
            args = [value(a) for a in node.args]
            if node.func.id in ("ceil", "floor") and len(args) != 1:
                raise ValueError(f"formula {formula!r}: {node.func.id} takes one argument, got {len(args)}")
            return _FUNCTIONS[node.func.id](*args)
        raise ValueError(f"formula {formula!r}: {ast.unparse(node)!r} is not allowed; use only {_ALLOWED}")

    result = value(tree.body)
    if isinstance(result, complex):  # a negative base to a fractional power
        raise ValueError(f"formula {formula!r} gives a complex number {result}")
    return float(result)


def _validate_formula(q: dict, where: str) -> None:
    inputs = q.get("inputs", {})
    if not isinstance(inputs, dict):
        raise ValueError(f"{where}: inputs must be an object of name -> number, got {inputs!r}")
    for name, v in inputs.items():
        if not name.isidentifier() or name in _FUNCTIONS:
            raise ValueError(f"{where}: input name {name!r} must be a Python identifier other than "
                             f"{', '.join(_FUNCTIONS)}")
        if type(v) not in (int, float):
            raise ValueError(f"{where}: input {name!r} = {v!r} must be a number")
    try:
        got = evaluate_formula(q["formula"], inputs)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if not abs(got - q["answer"]) <= q["tolerance"]:
        raise ValueError(f"{where}: formula {q['formula']!r} gives {got:g}, but the stored answer is "
                         f"{q['answer']:g} (tolerance {q['tolerance']:g})")


def validate_question(q: dict) -> None:
    """Check one question against the schema in the module docstring; returns None.

    Raises ValueError naming the question and the problem: a missing key, an empty explanation,
    fewer than two or repeated choices, an answer that is not a valid choice index or number, a
    missing tolerance, an unknown type, or a formula that is not allowed or misses the answer.
    """
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
        if type(q["answer"]) is not int or not 0 <= q["answer"] < len(choices):
            raise ValueError(f"{where}: answer {q['answer']!r} must be the index of exactly one choice "
                             f"(0..{len(choices) - 1})")
    elif q["type"] == "numeric":
        if type(q["answer"]) not in (int, float):
            raise ValueError(f"{where}: a numeric answer must be a number, got {q['answer']!r}")
        if type(q.get("tolerance")) not in (int, float) or q["tolerance"] <= 0:
            raise ValueError(f"{where}: a numeric question needs a tolerance > 0, got {q.get('tolerance')!r}")
        if "formula" in q:
            _validate_formula(q, where)
        elif "inputs" in q:
            raise ValueError(f"{where}: inputs are given without a formula that uses them")
    else:
        raise ValueError(f"{where}: type {q['type']!r} is unknown: use 'choice' or 'numeric'")


def load_quiz(name: str) -> list[dict]:
    """Questions of quiz ``name`` (file data/quizzes/<name>.json), validated.

    Returns the list of question dicts in file order.
    Raises ValueError if no such quiz exists (naming the ones that do), if question ids repeat,
    or if a question breaks the schema (see ``validate_question``).
    """
    return _validated(name, _quiz_file(name)["questions"])


def _quiz_file(name: str) -> dict:
    """The parsed data/quizzes/<name>.json; ValueError naming the quizzes that exist."""
    path = QUIZ_DIR / f"{name}.json"
    if not path.exists():
        known = sorted(p.stem for p in QUIZ_DIR.glob("*.json"))
        raise ValueError(f"quiz {name!r} not found: choose one of {', '.join(known)}")
    return json.loads(path.read_text())


def load_reading(name: str) -> list[dict]:
    """The reading questions of notebook ``name``: one under each listing of the engine's code
    (``show_source``), stored beside the quiz in data/quizzes/<name>.json under "reading", each
    with a "listing" naming what it reads. Same schema and checks as the quiz; ids start "read-".
    Raises ValueError as ``load_quiz`` does, and for a question without its listing."""
    questions = _validated(name, _quiz_file(name).get("reading", []))
    for q in questions:
        if not str(q["id"]).startswith("read-") or not q.get("listing"):
            raise ValueError(f"reading question {q['id']!r} of {name!r}: needs an id starting 'read-' and a "
                             "'listing'")
    return questions


def _validated(name: str, questions: list[dict]) -> list[dict]:
    ids = [q.get("id") for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"quiz {name!r}: question ids repeat")
    for q in questions:
        validate_question(q)
    return questions


def choice_order(name: str, q: dict, seed: int = 0) -> list[int]:
    """The order in which to show the choices of choice question ``q`` of quiz ``name``.

    Returns a permutation of range(len(q["choices"])): position i on screen shows stored choice
    order[i]. The same (name, question id, seed) always gives the same order, so a notebook rerun
    shows the same quiz; another seed gives another order.
    Raises ValueError if ``q`` is not a choice question.
    """
    if q.get("type") != "choice":
        raise ValueError(f"question {q.get('id', '?')!r}: only choice questions are shuffled, "
                         f"this one is {q.get('type')!r}")
    order = list(range(len(q["choices"])))
    # A string seed is hashed with SHA-512 by random.Random, so the order is stable across runs.
    random.Random(f"{name}:{q['id']}:{seed}").shuffle(order)
    return order


def is_answered(q: dict, answer) -> bool:
    """True if ``answer`` is something to check: a choice index, or a number (or text that parses
    as one) for a numeric question; False for None, blank text, or text that is not a number."""
    if answer is None:
        return False
    if q["type"] == "choice":
        return type(answer) is int
    try:
        float(answer)
    except (TypeError, ValueError):
        return False
    return True


def is_correct(q: dict, answer) -> bool:
    """True if ``answer`` (a choice index, or a number) is right for question ``q``; False for
    anything else, including no answer."""
    if answer is None:
        return False
    if q["type"] == "choice":
        return answer == q["answer"]
    try:
        return abs(float(answer) - q["answer"]) <= q["tolerance"]
    except (TypeError, ValueError):
        return False


def markup(text: str) -> str:
    """A quiz's text as HTML: escaped, with its `code` spans in <code> and **bold** in <b> (ipywidgets'
    HTML shows HTML, not markdown)."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def feedback(q: dict, answer) -> str:
    """HTML shown after Check: a verdict and the explanation, or a prompt when there is no answer.

    Returns "Choose an answer first." (choice) or "Enter a number first." (numeric) when nothing
    was given, and a hint when numeric text does not parse; neither reveals the explanation.
    """
    if not is_answered(q, answer):
        if q["type"] == "numeric" and answer is not None and str(answer).strip():
            return (f"'{html.escape(str(answer).strip())}' is not a number: enter digits with a decimal "
                    "point and no thousands separator, for example 2.5 or 1000.")
        return "Choose an answer first." if q["type"] == "choice" else "Enter a number first."
    if is_correct(q, answer):
        verdict = "<span style='color:green'>Correct.</span>"
    else:
        verdict = "<span style='color:#b00'>Not quite.</span>"
    return f"{verdict} {markup(q['explanation'])}"


class QuizScore:
    """Running score of one quiz: the latest checked answer of each question counts.

    A question answered wrongly and then rightly counts as correct, and the reverse as wrong, so
    the score says what the reader knows now. Unchecked questions count as not answered.
    """

    def __init__(self, question_ids: list[str]):
        self.question_ids = list(question_ids)
        self._latest: dict[str, bool] = {}

    def record(self, qid: str, correct: bool) -> None:
        """Store the latest result for question ``qid``. Raises ValueError for an unknown id."""
        if qid not in self.question_ids:
            raise ValueError(f"question {qid!r} is not in this quiz: ids are {', '.join(self.question_ids)}")
        self._latest[qid] = bool(correct)

    @property
    def num_correct(self) -> int:
        return sum(self._latest.values())

    @property
    def num_answered(self) -> int:
        return len(self._latest)

    def text(self) -> str:
        """One line such as "Score: 3 / 7 answered correctly (2 not answered yet)"."""
        total = len(self.question_ids)
        line = f"Score: {self.num_correct} / {total} answered correctly"
        if self.num_answered < total:
            line += f" ({total - self.num_answered} not answered yet)"
        return line


def show_quiz(name: str, seed: int = 0):
    """Render quiz ``name`` as ipywidgets: one block per question with a Check button, and a score.

    Choices appear in the order ``choice_order(name, q, seed)`` gives; the widget's value is still
    the stored index, so checking needs no mapping back. Returns the displayed ipywidgets.VBox.
    Raises ValueError if the quiz does not exist or is malformed (see ``load_quiz``).
    """
    import ipywidgets as w
    from IPython.display import display

    questions = load_quiz(name)
    score = QuizScore([q["id"] for q in questions])
    score_line = w.HTML(f"<b>{score.text()}</b>")

    def scored(q, right: bool) -> None:
        score.record(q["id"], right)
        score_line.value = f"<b>{score.text()}</b>"
    box = w.VBox([_question_block(name, q, f"Q{n}.", seed, scored) for n, q in enumerate(questions, 1)]
                 + [score_line])
    display(box)
    return box


def show_reading(name: str, question_id: str, seed: int = 0):
    """Render reading question ``question_id`` of notebook ``name`` (``load_reading``) under the
    listing it reads, with a Check button that shows the explanation. Returns the ipywidgets.VBox.
    Raises ValueError naming the ids that exist when ``question_id`` is not one of them."""
    from IPython.display import display

    questions = {q["id"]: q for q in load_reading(name)}
    if question_id not in questions:
        raise ValueError(f"reading question {question_id!r} of {name!r} not found: choose one of "
                         f"{', '.join(questions) or 'none'}")
    box = _question_block(name, questions[question_id], "Reading check:", seed, lambda q, right: None)
    display(box)
    return box


def _question_block(name: str, q: dict, label: str, seed: int, on_checked):
    """One question as ipywidgets: the question, its field, a Check button and the feedback;
    ``on_checked(q, right)`` runs after each answered check."""
    import ipywidgets as w

    title = w.HTML(f"<b>{label}</b> {markup(q['question'])}")
    if q["type"] == "choice":  # a radio button's label is plain text: code shown without its backticks
        options = [(q["choices"][i].replace("`", ""), i) for i in choice_order(name, q, seed)]
        field = w.RadioButtons(options=options, value=None, layout=w.Layout(width="auto"))
    else:
        # Text, not FloatText: an empty FloatText reads as 0.0 and would be checked as an answer.
        field = w.Text(description=q.get("unit", ""), placeholder="a number")
    button = w.Button(description="Check")
    result = w.HTML()

    def on_click(_):
        result.value = feedback(q, field.value)
        if is_answered(q, field.value):
            on_checked(q, is_correct(q, field.value))

    button.on_click(on_click)
    return w.VBox([title, field, w.HBox([button]), result])
