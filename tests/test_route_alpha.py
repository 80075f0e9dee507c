"""The simulator's JSON route alpha is read from the engine's measurement (issue 43, item 3):
``simulate --routes json=measured`` takes bench/results/json_routes.json's alpha for the drafter it
simulates, and a route or a row the measurement lacks is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minispec.sim.route_alpha import JSON_ROUTES_RESULT, measured_json_alpha, resolve_measured_routes


def committed(drafter: str, arm: str) -> float:
    rows = json.loads(JSON_ROUTES_RESULT.read_text())["rows"]
    return next(r["alpha"] for r in rows if (r["drafter"], r["arm"]) == (drafter, arm))


def test_the_measured_alpha_is_the_committed_runs_per_drafter_and_arm():
    assert measured_json_alpha() == pytest.approx(committed("eagle", "grammar+jump"))
    assert measured_json_alpha("ngram", "free") == pytest.approx(committed("ngram", "free"))
    assert measured_json_alpha("ngram", "grammar") != measured_json_alpha("ngram", "free")


def test_only_the_measured_word_is_replaced_and_weights_survive():
    alpha = measured_json_alpha("ngram")
    assert resolve_measured_routes("chat=0.8:3, json=measured:2", "ngram") == f"chat=0.8:3,json={alpha:.3f}:2"
    assert resolve_measured_routes("json=measured") == f"json={measured_json_alpha():.3f}"


@pytest.mark.parametrize("routes, drafter, match", [
    ("chat=measured:3,json=0.3", "eagle", "only the json route"),
    ("json=measured", "draft-model", "drafter='draft-model'.*it has .*eagle/grammar"),
])
def test_a_route_or_drafter_without_a_measurement_is_refused_by_name(routes, drafter, match):
    with pytest.raises(ValueError, match=match):
        resolve_measured_routes(routes, drafter)


def test_a_missing_results_file_names_the_command_that_writes_it(tmp_path):
    with pytest.raises(ValueError, match="python -m bench json_routes"):
        measured_json_alpha(path=tmp_path / "json_routes.json")


def simulate(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minispec", "simulate", "--concurrency", "8", "--num-requests", "24",
                           "--max-tokens", "16", *flags], capture_output=True, text=True, timeout=300)


def test_simulate_runs_the_json_route_at_the_measured_alpha_of_the_drafter_it_simulates():
    head = simulate("--routes", "chat=0.8:3,json=measured:1")
    assert head.returncode == 0, head.stderr
    assert f"json={measured_json_alpha('eagle'):.3f}:1" in head.stdout
    ngram = simulate("--spec", "off,ngram", "--routes", "json=measured")
    assert ngram.returncode == 0, ngram.stderr
    assert f"json={measured_json_alpha('ngram'):.3f}" in ngram.stdout
    tree = simulate("--draft", "ngram", "--draft-topk", "2", "--routes", "json=measured")
    assert tree.returncode == 0, tree.stderr
    assert f"json={measured_json_alpha('ngram-tree'):.3f}" in tree.stdout
    bad = simulate("--routes", "chat=measured,json=0.3")
    assert bad.returncode == 2 and "--routes" in bad.stderr and "chat" in bad.stderr and "Traceback" not in bad.stderr
