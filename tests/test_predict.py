"""course/predict.py: predict, then reveal (issue 57, item 1). Bad input records nothing and says so in
one line; a direction the rounds do not agree on cannot fail a prediction; the score counts; a headless
reveal without a prediction shows the measurement; every notebook asks, reveals and scores."""

import json
import re
from pathlib import Path

import pytest

from course import predict as pr
from course.noise import compare

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture
def book():
    b = pr.Predictions("test notebook")
    b.ask("knee", "Up to how many tokens?", unit="tokens")
    b.ask("way", "Faster or slower?", kind="choice", choices=["faster", "slower", "no measurable difference"])
    return b


@pytest.mark.parametrize("raw, why", [("", "nothing entered"), ("   ", "nothing entered"), (None, "nothing entered"),
                                      ("eight", "is not a number"), ("8 tokens please", "is not a number"),
                                      ("-3", "is negative"), (-0.5, "is negative"), ("nan", "not a finite number"),
                                      ("inf", "not a finite number"), (True, "is not a number")])
def test_a_bad_number_records_nothing_and_says_so_in_one_line(book, raw, why):
    line = book.commit("knee", raw)
    assert why in line and "Nothing was recorded" in line and "\n" not in line
    assert book.items["knee"].value is None


def test_a_bad_answer_after_a_good_one_keeps_the_earlier_prediction(book):
    assert "Recorded" in book.commit("knee", "8 tokens")  # a trailing unit is allowed
    line = book.commit("knee", "lots")
    assert "Nothing was recorded" in line and "earlier prediction, 8 tokens, stands" in line
    assert book.items["knee"].value == 8.0


@pytest.mark.parametrize("raw", [None, "", "quicker"])
def test_a_choice_not_among_the_choices_records_nothing(book, raw):
    line = book.commit("way", raw)
    assert "Nothing was recorded" in line and "\n" not in line and book.items["way"].value is None


def test_a_direction_the_rounds_disagree_on_cannot_fail_the_prediction(book):
    noisy = compare([1.10, 0.92, 1.04], [1.0, 1.0, 1.0])  # one round each way: too noisy to tell
    assert noisy.finding == "noisy"
    book.commit("way", "slower")
    line = book.reveal("way", noisy)
    assert book.items["way"].outcome == pr.NOT_JUDGED and "Not judged" in line and "cannot count against you" in line
    # every round on one side, some inside the dead zone: "probably", still not a finding
    book.ask("way", "again", kind="choice", choices=["faster", "slower"])
    book.commit("way", "slower")
    book.reveal("way", compare([1.03, 1.08, 1.10], [1.0, 1.0, 1.0]))
    assert book.items["way"].outcome == pr.NOT_JUDGED


def test_a_direction_every_round_settles_is_held_or_missed(book):
    faster = compare([1.3, 1.25, 1.4], [1.0, 1.0, 1.0])
    book.commit("way", "slower")
    assert "Missed" in book.reveal("way", faster) and book.items["way"].outcome == pr.MISSED
    book.ask("way", "again", kind="choice", choices=["faster", "slower", "no measurable difference"])
    book.commit("way", "no measurable difference")
    book.reveal("way", compare([1.01, 0.99, 1.02], [1.0, 1.0, 1.0]))  # every round inside the dead zone: a tie
    assert book.items["way"].outcome == pr.HELD


def test_03s_retiming_rule_is_direction_of():
    assert pr.direction_of(compare([2.0, 2.1], [1.0, 1.0])) == "higher"
    assert pr.direction_of(compare([0.5, 0.4], [1.0, 1.0]), "faster", "slower") == "slower"
    for arm in ([1.1, 0.9], [1.02, 1.08], [1.5]):  # noisy, probably, one round: left open
        assert pr.direction_of(compare(arm, [1.0] * len(arm))) is None


def test_a_number_is_judged_against_the_rounds_range_widened_by_the_tolerance(book):
    book.commit("knee", 16)
    assert book.reveal("knee", 4, band=(4, 8), tolerance=1.0).count("Held") == 1  # 8 x 2 = 16
    book.ask("knee", "again", unit="tokens")
    book.commit("knee", 32)
    assert "Missed: outside 2-16 tokens" in book.reveal("knee", 4, band=(4, 8), tolerance=1.0)
    book.ask("ratio", "speedup?", unit="x")
    book.commit("ratio", "1.5x")
    assert "Not judged" in book.reveal("ratio", compare([1.9], [1.0]))  # one round: no spread to judge by
    book.ask("sim", "simulated?", unit="x")
    book.commit("sim", 1.3)
    book.reveal("sim", 1.0)  # no band: a value without noise, give or take 20%
    assert book.items["sim"].outcome == pr.MISSED
    noisy = compare([1.4, 0.8, 1.1], [1.0, 1.0, 1.0])  # the rounds disagree on the direction
    for guess, outcome in ((1.0, pr.NOT_JUDGED), (5.0, pr.MISSED)):  # inside their range no finding; beyond, a miss
        book.ask("wide", "?", unit="x")
        book.commit("wide", guess)
        book.reveal("wide", noisy)
        assert book.items["wide"].outcome == outcome


def test_a_reveal_after_the_measurement_refuses_a_late_prediction(book):
    book.reveal("knee", 4, band=(4, 8))
    assert "already revealed" in book.commit("knee", 8) and book.items["knee"].value is None


def test_the_score_counts_held_unjudged_and_unanswered(book):
    book.commit("knee", 8)
    book.reveal("knee", 8, band=(6, 9))                             # held
    book.commit("way", "faster")
    book.reveal("way", compare([1.1, 0.9], [1.0, 1.0]))              # noise: not judged
    book.ask("third", "?", kind="choice", choices=["a", "b"])
    book.commit("third", "a")
    book.reveal("third", "b")                                        # missed
    book.ask("fourth", "?", unit="x")
    book.reveal("fourth", 2.0)                                       # no prediction
    book.ask("fifth", "?", unit="x")
    book.commit("fifth", 1)                                          # not revealed yet
    line = book.score_line()
    assert line.startswith("Your predictions in test notebook: 1 of 3 predictions held; 1 could not be judged "
                           "on this run's noise; 1 measurement revealed with no prediction recorded; 1 committed")
    assert "\n" not in line


def test_headless_predict_shows_no_widget_and_reveal_shows_the_measurement(monkeypatch, capsys):
    monkeypatch.setenv("MINISPEC_HEADLESS", "1")
    assert pr.predict("speedup", "How many times?", unit="x", notebook="headless test") is None
    assert pr.reveal("speedup", compare([1.2, 1.3, 1.25], [1.0, 1.0, 1.0]), notebook="headless test") == \
        pr.NO_PREDICTION
    out = capsys.readouterr().out
    assert "no prediction recorded" in out and "1.25x (1.20-1.30 over the rounds)" in out
    assert "0 of 0 predictions held" in pr.score(notebook="headless test")


def test_the_widget_commits_a_number_and_refuses_text(monkeypatch):
    monkeypatch.delenv("MINISPEC_HEADLESS", raising=False)
    box = pr.predict("w", "How many?", unit="x", notebook="widget test")
    field, button, said = box.children[1].children[0], *box.children[2].children
    field.value = "fast"
    button.click()
    assert "not a number" in said.value and pr.book("widget test").items["w"].value is None
    field.value = "2.5"
    button.click()
    assert pr.book("widget test").items["w"].value == 2.5
    choice = pr.predict("c", "Which?", kind="choice", choices=["a", "b"], notebook="widget test")
    choice.children[2].children[0].click()  # nothing picked
    assert "no choice picked" in choice.children[2].children[1].value


def test_predict_refuses_a_malformed_question():
    with pytest.raises(ValueError, match="two or more distinct choices"):
        pr.Predictions("x").ask("k", "?", kind="choice", choices=["a"])
    with pytest.raises(ValueError, match="kind must be one of"):
        pr.Predictions("x").ask("k", "?", kind="text")


def _code_cells(path):
    return [(i, "".join(c["source"])) for i, c in enumerate(json.loads(path.read_text())["cells"])
            if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_predicts_then_reveals_and_closes_with_a_score(path):
    cells = json.loads(path.read_text())["cells"]
    code = _code_cells(path)
    asked = {m: i for i, text in code for m in re.findall(r'\bpredict\(\s*"([^"]+)"', text)}
    revealed = {m: i for i, text in code for m in re.findall(r'\breveal\(\s*"([^"]+)"', text)}
    assert asked, f"{path.name}: no predict( cell"
    assert any(revealed.get(key, -1) > i for key, i in asked.items()), f"{path.name}: no reveal after a predict"
    for key, i in asked.items():
        assert revealed.get(key, -1) > i, f"{path.name}: predict({key!r}) is never revealed after it"
    scores = [i for i, text in code if re.search(r"^score\(\);", text, re.M)]
    before_next = [i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Before the next notebook")]
    quiz = [i for i, text in code if "show_quiz(" in text]
    assert len(scores) == 1 and before_next and quiz, path.name
    assert quiz[0] < scores[0] < before_next[0], f"{path.name}: score() goes after the quiz, before the last markdown"
    for i, text in code:
        if re.search(r"\b(predict|reveal|score)\(", text):
            assert len(text.splitlines()) <= 25 and text.rstrip().endswith(";"), (path.name, i)
