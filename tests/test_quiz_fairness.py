"""A quiz's right choice does not give itself away by length (issue 37: the answers of sc-1 and sc-3, then mt-5 and mt-7,
were much longer than the other choices; issue 57: the answer was the longest choice in 9 of 32 questions and 5 of
12 reading checks, ties counted, and sd-2's answer was half as long as any other choice), and a reading check's
widget is drawn once (issue 57: every reading cell showed it twice, its return value displayed under it)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIZZES = ROOT / "data" / "quizzes"
NOTEBOOKS = ROOT / "notebooks"
MAX_LONGEST = {"questions": 4, "reading": 2}  # of 32 questions and 12 reading checks: about one in eight
STANDS_OUT = 1.15  # an answer 15% longer (or shorter) than every other choice can be told by its length


def choice_questions(part: str) -> list[dict]:
    """Every choice question of every quiz file, from its "questions" or its "reading" list."""
    out = []
    for path in sorted(QUIZZES.glob("*.json")):
        out += [q for q in json.loads(path.read_text()).get(part, []) if q.get("type") == "choice"]
    return out


def answer_is_longest(q: dict) -> bool:
    lengths = [len(c) for c in q["choices"]]
    return lengths[q["answer"]] == max(lengths)  # a tie for the longest counts


def stands_out(q: dict) -> str | None:
    """Why the answer of ``q`` can be picked by its length alone, or None."""
    lengths = [len(c) for c in q["choices"]]
    right = lengths[q["answer"]]
    others = [n for i, n in enumerate(lengths) if i != q["answer"]]
    if right > STANDS_OUT * max(others):
        return f"{q['id']}: answer {right} characters, every other choice at most {max(others)}"
    if right * STANDS_OUT < min(others):
        return f"{q['id']}: answer {right} characters, every other choice at least {min(others)}"
    return None


def test_no_answer_is_much_longer_than_every_other_choice():
    offenders = []
    for q in choice_questions("questions") + choice_questions("reading"):
        lengths = [len(c) for c in q["choices"]]
        right = lengths[q["answer"]]
        others = [n for i, n in enumerate(lengths) if i != q["answer"]]
        if right > 1.5 * max(others):
            offenders.append(f"{q['id']}: answer {right} characters, the longest other choice {max(others)}")
    assert not offenders, "\n".join(offenders)


def test_no_answer_is_told_apart_by_its_length():
    offenders = [why for q in choice_questions("questions") + choice_questions("reading") if (why := stands_out(q))]
    assert not offenders, "\n".join(offenders)


def test_the_rule_catches_the_answers_issue_57_found():
    """The check above on sd-2 as it stood (its answer 26 characters against 51-53) and on a 15% longer answer."""
    sd2 = {"id": "sd-2", "answer": 1, "choices": ["Usually identical, but now and then a close synonym",
                                                    "Identical, token for token",
                                                    "Identical only in steps where every draft is accepted",
                                                    "Shorter, because rejected drafts cut each step short"]}
    assert stands_out(sd2).startswith("sd-2: answer 26 characters")
    assert stands_out({"id": "x", "answer": 0, "choices": ["a" * 116, "b" * 100, "c" * 90]})
    assert stands_out({"id": "x", "answer": 0, "choices": ["a" * 110, "b" * 100, "c" * 90]}) is None


def test_the_longest_choice_is_the_answer_in_few_questions():
    for part, cap in MAX_LONGEST.items():
        questions = choice_questions(part)
        longest = [q["id"] for q in questions if answer_is_longest(q)]
        assert len(longest) <= cap, (f"{part}: the answer is the longest choice (ties counted) in {len(longest)} of "
                                     f"{len(questions)}: {', '.join(longest)}; at most {cap} allowed")


def reading_cells() -> list[tuple[str, str]]:
    """(notebook stem, source) of every code cell of the course notebooks that shows a reading check."""
    out = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"^show_reading\(", source, re.M):
                out.append((path.stem, source))
    return out


def test_every_reading_widget_is_drawn_once():
    """show_reading displays its widget and returns it; without a trailing ';' on the cell's last line the
    notebook displays the returned widget a second time."""
    cells = reading_cells()
    twice = [f"{stem}: {source.strip().splitlines()[-1]}" for stem, source in cells
             if not source.strip().splitlines()[-1].rstrip().endswith(";")]
    assert cells and not twice, "\n".join(twice)


def test_every_reading_check_has_exactly_one_cell():
    shown = [(stem, m) for stem, source in reading_cells()
             for m in re.findall(r'show_reading\("([^"]+)", "([^"]+)"\)', source)]
    assert all(stem == name for stem, (name, _) in shown), shown
    stored = sorted((path.stem, q["id"]) for path in sorted(QUIZZES.glob("*.json"))
                    for q in json.loads(path.read_text()).get("reading", []))
    assert sorted(m for _, m in shown) == stored
