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
    assert "[minispec] KV cache: " in plain.stderr and "sized by kv_cache_bytes=" in plain.stderr  # start-up report
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
    # interleaved: at each concurrency spec off, then n-gram, so each speedup compares neighbours
    assert [(r["spec"], r["concurrency"]) for r in rows] == [("off", 1), ("ngram", 1), ("off", 2), ("ngram", 2)]
    keys = {"concurrency", "num_requests", "throughput_tok_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s",
            "tpot_p90_s", "itl_p99_s", "goodput_rps", "wall_s", "spec", "k", "policy", "acceptance_rate",
            "mean_accepted_length", "speedup_vs_off"}
    assert all(keys <= set(r) for r in rows)
    assert rows[0]["speedup_vs_off"] == 1.0 and rows[1]["acceptance_rate"] is not None
    assert all(r["kernels"] == "fast" and r["weights"] == "float32" for r in rows)
    assert "speedup" in res.stdout


def test_bad_input_is_a_clear_error():
    res = run("generate", "--prompt", "hi", "--model", "no-such-model")
    assert res.returncode == 2 and "is not an alias" in res.stderr and "smollm2-135m-instruct" in res.stderr
    res = run("generate", "--prompt", "hi", "--temperature", "-1")
    assert res.returncode == 2 and "temperature=-1.0" in res.stderr
    res = run("bench", "--concurrency", "0")
    assert res.returncode == 2 and "must be an integer >= 1" in res.stderr


def test_every_subcommand_is_registered_and_has_help(capsys):
    names = ["generate", "bench", "simulate", "profile", "serve", "info"]
    assert [m.__name__.rsplit(".", 1)[-1] for m in SUBCOMMANDS] == names
    parser = build_parser()
    for name in names:
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args([name, "--help"])
        assert exit_info.value.code == 0
        assert f"python -m minispec {name}" in capsys.readouterr().out


# -- issue 15, fault 9: bad input is named before any model loads -------------------------------------

@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if a subcommand reaches for a model before its flags were all checked."""
    import minispec.cli.bench
    import minispec.cli.generate
    import minispec.cli.serve
    import minispec.cli.simulate

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(minispec.cli.bench, "load_model", refuse)
    for module in (minispec.cli.bench, minispec.cli.generate, minispec.cli.serve):
        monkeypatch.setattr(module, "build_engine", refuse)
    monkeypatch.setattr(minispec.cli.simulate, "sim_rows", refuse)  # the simulator's engines


@pytest.mark.parametrize("argv, needles", [
    (["bench", "--num-requests", "0"], ["--num-requests", "0", ">= 1"]),
    (["bench", "--max-tokens", "0"], ["--max-tokens", "0"]),
    (["bench", "--temperature", "-1"], ["--temperature", "-1"]),
    (["bench", "--qps", "0"], ["--qps", "0"]),
    (["bench", "--k", "0"], ["--k", "0", "1..16"]),
    (["bench", "--block-size", "0"], ["--block-size", "0"]),
    (["generate", "--prompt", ""], ["--prompt", "empty"]),
    (["generate", "--prompt", "", "--no-chat"], ["--prompt", "empty"]),
    (["generate", "--prompt", "hi", "--max-tokens", "0"], ["--max-tokens", "max_tokens=0"]),
    (["generate", "--prompt", "hi", "--top-p", "2"], ["--top-p", "top_p=2.0"]),
    (["generate", "--prompt", "hi", "--policy", "sometimes"], ["--policy", "sometimes"]),
    (["bench", "--spec", "draft", "--draft-confidence-threshold", "1.5"],
     ["--draft-confidence-threshold", "1.5", "[0, 1)"]),
    (["simulate", "--draft-confidence-threshold", "0.3"], ["--draft-confidence-threshold 0.3", "leave it at 0"]),
    # each was ignored without a word before check_draft_flags
    (["generate", "--prompt", "hi", "--draft-confidence-threshold", "0.5"],
     ["--draft-confidence-threshold 0.5", "--spec draft", "'off'"]),
    (["generate", "--prompt", "hi", "--spec", "ngram", "--draft", "some/where"], ["--draft some/where", "'ngram'"]),
    (["bench", "--spec", "off,ngram", "--draft", "smollm2-135m-draft"], ["--draft smollm2-135m-draft", "'off,ngram'"]),
    (["generate", "--prompt", "hi", "--spec", "draft", "--draft", ""], ["--draft ''", "empty"]),
    (["generate", "--prompt", "hi", "--prefix-caching", "off,on"], ["--prefix-caching", "lists are for bench"]),
    (["bench", "--url", "http://localhost:1", "--prefix-caching", "off,on"], ["--prefix-caching", "server's setting"]),
    (["serve", "--port", "0"], ["--port", "0"]),
    (["serve", "--max-num-seqs", "0"], ["--max-num-seqs", "max_num_seqs=0"]),
    # issue 41, item 5: a policy that takes no argument refuses one (it was dropped without a word)
    (["generate", "--prompt", "hi", "--policy", "always:3"], ["--policy", "'always:3'", "no argument", "--k"]),
    (["bench", "--policy", "never:2"], ["--policy", "'never:2'", "no argument"]),
    (["serve", "--policy", "lane:bulk"], ["--policy", "'lane:bulk'", "no argument", "interactive"]),
    (["simulate", "--policy", "always:"], ["--policy", "'always:'", "no argument"]),
    # issue 41, item 6: simulate runs the same preflight, so its errors name the flag
    (["simulate", "--alpha", "1.5"], ["--alpha", "alpha=1.5"]),
    (["simulate", "--k", "0"], ["--k", "1..16"]),
    (["simulate", "--policy", "sometimes"], ["--policy", "'sometimes'"]),
    (["simulate", "--policy", "threshold:x"], ["--policy", "threshold:N"]),
    (["simulate", "--lanes", "interactive=2"], ["--lanes", "interactive=2"]),
    (["simulate", "--max-num-seqs", "0"], ["--max-num-seqs", "max_num_seqs=0"]),
    (["simulate", "--spec", "bogus"], ["--spec", "'bogus'"]),
    (["simulate", "--routes", "chat"], ["--routes", "'chat'"]),
    (["bench", "--routes", "chat:0"], ["--routes 'chat:0'", "whole number >= 1"]),  # was a ZeroDivisionError
    (["generate", "--prompt", "hi", "--dtype", "float16"], ["--dtype", "'float16'", "give weights"]),  # half-ran
    # an output that cannot be written is refused before the run (it failed after it, the rows lost)
    (["bench", "--json", "no/such/folder/out.json"], ["--json no/such/folder/out.json", "does not exist"]),
    (["simulate", "--plot", "no/such/folder/p.png"], ["--plot no/such/folder/p.png", "does not exist"]),
    (["profile", "--output", "no/such/folder/x.json"], ["--output no/such/folder/x.json", "does not exist"]),
    (["simulate", "--num-requests", "0"], ["--num-requests", "0"]),
    (["simulate", "--model", "no-such-shape"], ["--model", "'no-such-shape'"]),
    # issue 41, item 7: --cuda-graphs is checked before the model loads, by name
    (["generate", "--prompt", "hi", "--cuda-graphs", "on", "--device", "cpu"], ["--cuda-graphs on", "CUDA", "cpu"]),
    (["bench", "--cuda-graphs", "on", "--device", "cpu"], ["--cuda-graphs on", "CUDA"]),
    (["simulate", "--cuda-graphs", "on"], ["--cuda-graphs", "--hardware", "@"]),
    (["simulate", "--device", "cuda"], ["--device cuda", "--hardware"]),  # simulate runs no model
    (["simulate", "--kernels", "reference"], ["--kernels reference", "--hardware"]),
    # issue 43: structured output is compiled before the model loads, and a bad one names its flag
    (["generate", "--prompt", "hi", "--regex", "("], ["--regex '('", "cannot be compiled"]),
    (["generate", "--prompt", "hi", "--regex", "[a"], ["--regex '[a'", "unclosed character class"]),  # was cut
    (["generate", "--prompt", "hi", "--regex", "[^\\s\\S]"], ["--regex", "matches no string"]),
    (["generate", "--prompt", "hi", "--json-schema", "no/such/schema.json"], ["--json-schema no/such/schema.json",
                                                                             "cannot read the file"]),
    (["bench", "--regex", "x{0}"], ["--regex 'x{0}'", "only the empty string"]),
    (["bench", "--url", "http://localhost:1", "--regex", "[a-z]+"], ["--regex", "response_format"]),
])
def test_every_flag_is_checked_before_a_model_loads_and_the_flag_is_named(no_model_loads, capsys, argv, needles):
    from minispec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("minispec: error: ") and all(n in err for n in needles), err


def test_low_bit_weights_without_the_cpu_kernel_are_refused_before_a_model_loads(no_model_loads, capsys,
                                                                                monkeypatch):
    """--weights int4 on a CPU without PyTorch's int4 kernel (no AVX2): one line naming the flag and
    what to use instead, before anything loads (issue 42)."""
    from minispec.cli import main

    monkeypatch.setattr("torch.backends.cpu.get_cpu_capability", lambda: "DEFAULT")
    assert main(["generate", "--prompt", "hi", "--weights", "int4", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minispec: error: --weights int4") and "use --weights float32 or bfloat16" in err, err
    assert err.count("\n") == 1


def test_compile_on_without_a_compiler_or_off_a_cpu_is_refused_before_a_model_loads(no_model_loads, capsys,
                                                                                   monkeypatch):
    """Issue 58: --compile on where torch.compile has no C++ compiler gets one line naming the flag and
    what is missing, before anything loads; simulate, which runs no model, refuses the flag by name."""
    import minispec.graphs.compiled_step as compiled_step
    from minispec.cli import main

    monkeypatch.setattr(compiled_step.shutil, "which", lambda name: None)
    assert main(["generate", "--prompt", "hi", "--compile", "on", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minispec: error: --compile on: torch.compile's C++ compiler") and "not on PATH" in err
    assert err.count("\n") == 1
    assert main(["simulate", "--compile", "on"]) == 2
    assert "--compile" in capsys.readouterr().err


def test_bad_flags_get_one_line_without_a_traceback():
    """A bad flag ends the command with one line on stderr naming it, exit status 2 (issue 41)."""
    for argv in (["simulate", "--alpha", "1.5"], ["generate", "--prompt", "hi", "--policy", "lane:bulk"],
                 ["simulate", "--cuda-graphs", "off"]):
        res = run(*argv, timeout=120)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("minispec: error: --"), res.stderr


def test_simulate_takes_its_engine_mode_from_hardware_not_cuda_graphs(capsys):
    """Issue 41, item 7: ``simulate --cuda-graphs on|off`` gave identical rows (the engine mode comes
    from --hardware). The flag is not simulate's: its help does not list it (nor the other flags of
    a device simulate runs none of) and says which flag chooses the engine mode; generate, bench,
    serve and profile keep it."""
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["simulate", "--help"])
    help_text = capsys.readouterr().out
    assert "CUDA graphs" in help_text and "NAME@MODE" in help_text
    assert not any(flag in help_text for flag in ("--cuda-graphs", "--device", "--kernels", "--weights "))
    for name in ("generate", "bench", "serve", "profile"):
        with pytest.raises(SystemExit):
            parser.parse_args([name, "--help"])
        assert "--cuda-graphs" in capsys.readouterr().out


def test_prefix_caching_is_on_by_default_off_in_simulate_and_a_list_where_swept():
    from minispec.cli.args import engine_config

    parser = build_parser()
    assert engine_config(parser.parse_args(["generate", "--prompt", "hi"])).enable_prefix_caching
    off = parser.parse_args(["serve", "--prefix-caching", "off"])
    assert not engine_config(off).enable_prefix_caching
    assert parser.parse_args(["bench", "--prefix-caching", "off, on"]).prefix_caching == [False, True]
    assert parser.parse_args(["simulate"]).prefix_caching == [False]  # its default prompts are placeholders
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--prefix-caching", "yes"])


def test_draft_flags_pass_wherever_a_spec_reads_them():
    from argparse import Namespace

    from minispec.cli.preflight import check_draft_flags

    for spec in ("draft", "off,draft", "ngram, draft"):
        check_draft_flags(Namespace(spec=spec, draft="smollm2-135m-draft", draft_confidence_threshold=0.5))
    check_draft_flags(Namespace(spec="off", draft=None, draft_confidence_threshold=0.0))


@pytest.mark.parametrize("text, needle", [("{\"type\": ", "not valid JSON"), ('{"type": "foo"}', "Invalid type: foo"),
                                          ('{"type": "integer", "minimum": 3, "maximum": 1}', "Unsatisfiable")])
def test_a_bad_json_schema_file_is_one_line_naming_the_flag_and_file(no_model_loads, capsys, tmp_path, text, needle):
    from minispec.cli import main

    path = tmp_path / "schema.json"
    path.write_text(text)
    for argv in (["generate", "--prompt", "hi"], ["bench"]):
        assert main(argv + ["--json-schema", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"minispec: error: --json-schema {path}: ") and needle in err and err.count("\n") == 1, err


def test_a_broken_prompts_file_names_the_file_and_line(no_model_loads, capsys, tmp_path):
    from minispec.cli import main
    from minispec.tools.workload import load_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "fine"}\n\n{"prompt": "cut off here", "max_tokens": 3\n')
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        load_prompts(path)
    assert main(["bench", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3" in err and "--prompts" in err


def test_an_unknown_hub_name_offline_fails_at_once_with_the_aliases(tmp_path):
    """No connection (the hub endpoint refuses) and nothing cached: no retries, the aliases and the
    hint that hub names need a connection. Before: a dozen retry lines and about 30 s."""
    import os
    import time

    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_OFFLINE": "0"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "minispec", "generate", "--prompt", "hi", "--model",
                          "nobody/no-such-model"], capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - t0
    assert res.returncode == 2, res.stderr
    assert "Retrying" not in res.stderr and elapsed < 20, (elapsed, res.stderr)
    assert "smollm2-135m-instruct" in res.stderr and "connection" in res.stderr and "--model" in res.stderr


@pytest.mark.parametrize("hidden, intermediate, named", [(48, 96, "hidden_size 48"), (64, 80, "intermediate_size 80")])
def test_int4_on_widths_that_are_not_multiples_of_32_is_refused_before_the_model_loads(
        no_model_loads, capsys, tmp_path, hidden, intermediate, named):
    """--weights int4 on a checkpoint whose projection widths are not multiples of 32 (a tiny Llama
    that loads and runs in float32): one line naming the flag, the width and what to use instead,
    from the checkpoint's config, before the KV-cache line or the weights (issue 59; it used to
    load the model, then exit with the quantizer's message)."""
    from transformers import LlamaConfig

    from minispec.cli import main

    LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16 if hidden == 64 else 12,
                max_position_embeddings=128).save_pretrained(tmp_path)
    assert main(["generate", "--prompt", "hi", "--model", str(tmp_path), "--weights", "int4",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minispec: error: --weights int4") and named in err and "--weights int8" in err, err
    assert err.count("\n") == 1
