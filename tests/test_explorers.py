"""Explorers are safe to move (issue 37, item 5): course.interact draws every value its
controls offer or says in one line why it cannot; headless with MINISPEC_EXPLORE_EXTREMES=1 it
drives every control to its ends, as the test run of the notebooks does."""

import ipywidgets as w
import matplotlib
import pytest

matplotlib.use("Agg")

import course as course  # noqa: E402


def explorer(calls, fail_at=None):
    def explore(alpha=0.5, k=4, hardware="h100"):
        calls.append((alpha, k, hardware))
        if fail_at is not None and (alpha, k, hardware)[fail_at[0]] == fail_at[1]:
            raise ValueError("Llama-3-8B needs 32.1 GB of weights")
        return alpha
    return explore


def test_headless_explorers_visit_every_controls_ends(monkeypatch):
    monkeypatch.setenv("MINISPEC_HEADLESS", "1")
    monkeypatch.setenv("MINISPEC_EXPLORE_EXTREMES", "1")
    calls = []
    course.interact(explorer(calls), alpha=w.FloatSlider(value=0.5, min=0.1, max=0.9), k=(1, 8),
                    hardware=["h100", "h200", "this"])
    assert calls[0] == (0.5, 4, "h100")  # the starting values first
    assert {(0.1, 4, "h100"), (0.9, 4, "h100"), (0.5, 1, "h100"), (0.5, 8, "h100"),
            (0.5, 4, "this")} <= set(calls)


def test_a_value_an_explorer_cannot_draw_fails_the_test_run_naming_it(monkeypatch):
    monkeypatch.setenv("MINISPEC_HEADLESS", "1")
    monkeypatch.setenv("MINISPEC_EXPLORE_EXTREMES", "1")
    with pytest.raises(RuntimeError, match="cannot draw hardware='this'.*32.1 GB"):
        course.interact(explorer([], fail_at=(2, "this")), alpha=(0.1, 0.9), k=(1, 8), hardware=["h100", "this"])


def test_a_learner_sees_one_line_not_a_traceback(monkeypatch, capsys):
    monkeypatch.delenv("MINISPEC_HEADLESS", raising=False)
    shown = {}
    monkeypatch.setattr(w, "interact", lambda fn, **widgets: shown.setdefault("fn", fn))
    course.interact(explorer([], fail_at=(2, "this")), alpha=(0.1, 0.9), k=(1, 8), hardware=["h100", "this"])
    assert shown["fn"](alpha=0.5, k=4, hardware="this") is None
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and "hardware='this'" in out and "32.1 GB" in out and "Traceback" not in out


def test_this_hardware_is_offered_only_once_this_machine_is_profiled(monkeypatch):
    monkeypatch.setattr(course, "machine_name", lambda device_type="cpu": "another laptop, 8 cores")
    assert "this" not in course.explorer_hardware() and "h100" in course.explorer_hardware()


def test_notebook_output_wraps_long_lines_at_spaces_and_leaves_tables():
    import io
    out = io.StringIO()
    w_ = course.WrappedOutput(out, width=40)
    print("word " * 20 + "end", file=w_)
    print("a | b | " + "c" * 60, file=w_)
    print("  c=4" + " " * 40 + "0.64x      0.86x      1.20x", file=w_)  # columns aligned with spaces: a table's row
    w_.write("tail without newline " * 3)
    w_.flush()
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 40 for line in lines[:3]) and lines[1].startswith("  ")
    assert any(line.startswith("a | b | ") and len(line) > 40 for line in lines)
    assert any(line.startswith("  c=4 ") and line.endswith("1.20x") for line in lines)
    assert "".join(out.getvalue().split()).count("word") == 20
