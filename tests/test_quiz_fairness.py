"""A quiz's right choice does not give itself away by length (issue 37: the answers of sc-1 and sc-3, then mt-5 and mt-7,
were much longer than the other choices)."""

import json
from pathlib import Path

QUIZZES = Path(__file__).resolve().parents[1] / "data" / "quizzes"


def test_no_answer_is_much_longer_than_every_other_choice():
    offenders = []
    for path in sorted(QUIZZES.glob("*.json")):
        data = json.loads(path.read_text())
        for q in data if isinstance(data, list) else data["questions"] + data.get("reading", []):
            if q.get("type") != "choice":
                continue
            lengths = [len(c) for c in q["choices"]]
            right = lengths[q["answer"]]
            others = [n for i, n in enumerate(lengths) if i != q["answer"]]
            if right > 1.5 * max(others):
                offenders.append(f"{q['id']}: answer {right} characters, the longest other choice {max(others)}")
    assert not offenders, "\n".join(offenders)
