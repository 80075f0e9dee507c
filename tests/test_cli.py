"""CLI smoke tests on the real bundled model (generate) and a short bench."""

import json
import subprocess
import sys

import pytest

from minispec.cli import SUBCOMMANDS, build_parser


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "minispec", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_names_paris_and_spec_matches_plain():
    plain = run("generate", "--prompt", "What is the capital of France?", "--max-tokens", "20", "--temperature", "0")
    assert plain.returncode == 0, plain.stderr
    assert "Paris" in plain.stdout and "TTFT" in plain.stderr
    spec = run("generate", "--prompt", "What is the capital of France?", "--max-tokens", "20", "--temperature", "0",
               "--spec", "ngram", "--k", "4")
    assert spec.returncode == 0, spec.stderr
    assert spec.stdout == plain.stdout and "acceptance" in spec.stderr


def test_bench_writes_rows_with_speedups(tmp_path):
    out = tmp_path / "rows.json"
    res = run("bench", "--spec", "off,ngram", "--concurrency", "1,2", "--num-requests", "2", "--max-tokens", "8",
              "--prompts", "copy", "--json", str(out))
    assert res.returncode == 0, res.stderr
    rows = json.loads(out.read_text())
    assert [(r["spec"], r["concurrency"]) for r in rows] == [("off", 1), ("off", 2), ("ngram", 1), ("ngram", 2)]
    keys = {"concurrency", "num_requests", "throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
            "tpot_p90_s", "itl_p99_s", "goodput_rps", "wall_s", "spec", "k", "policy", "acceptance_rate",
            "mean_accepted_length", "speedup_vs_off"}
    assert all(keys <= set(r) for r in rows)
    assert rows[0]["speedup_vs_off"] == 1.0 and rows[2]["acceptance_rate"] is not None
    assert "speedup" in res.stdout


def test_bad_input_is_a_clear_error():
    res = run("generate", "--prompt", "hi", "--model", "no-such-model")
    assert res.returncode == 2 and "is not an alias" in res.stderr and "smollm2-135m-instruct" in res.stderr
    res = run("generate", "--prompt", "hi", "--temperature", "-1")
    assert res.returncode == 2 and "temperature=-1.0" in res.stderr
    res = run("bench", "--concurrency", "0")
    assert res.returncode == 2 and "must be an integer >= 1" in res.stderr


def test_every_subcommand_is_registered_and_has_help(capsys):
    names = ["generate", "bench", "simulate", "profile", "serve"]
    assert [m.__name__.rsplit(".", 1)[-1] for m in SUBCOMMANDS] == names
    parser = build_parser()
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0
        assert f"python -m minispec {name}" in capsys.readouterr().out
