"""The machine card (issue 56, item 1): which weight formats run natively on this CPU, what the
engine does where a format or oneDNN is missing, and the engine's stack named (issue 55, item 3)."""

import logging
import os
import subprocess
import sys

import pytest
import torch

import minispec.models.kernels as kernels
from minispec.base.config import SpecConfig
from minispec.core.request import SamplingParams
from minispec.models.llama import LlamaModel
from minispec.models.machine import check_isa_variables, format_machine_card, machine_card

from conftest import tiny_config, tiny_engine

CPU = torch.device("cpu")


def _probes(monkeypatch, capability: str, bf16: bool, onednn: bool = True):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(kernels, "onednn_bf16_supported", lambda: bf16)
    monkeypatch.setattr(kernels, "onednn_available", lambda: onednn)


@pytest.mark.parametrize("capability, bf16, want", [
    ("AVX512", True, {"float32": "native", "bfloat16": "native", "int8": "native", "int4": "native"}),
    ("AVX2", False, {"float32": "native", "bfloat16": "emulated", "int8": "emulated", "int4": "emulated"}),
    ("DEFAULT", False, {"float32": "native", "bfloat16": "emulated", "int8": "unavailable",
                        "int4": "unavailable"}),
], ids=["avx512-bf16", "avx2 laptop", "no avx (arm64)"])
def test_each_format_is_native_emulated_or_unavailable_by_what_the_cpu_has(monkeypatch, capability, bf16, want):
    _probes(monkeypatch, capability, bf16)
    support = kernels.format_support(CPU)
    assert {f: why.split(":")[0] for f, why in support.items()} == want
    card = format_machine_card(machine_card(CPU))
    assert f"CPU capability {capability}" in card and "(the default is float32)" in card
    for f, kind in want.items():
        assert kind == "native" or f"  {f}: {kind}" in card, card


def test_the_restricted_instruction_set_reports_what_an_avx2_laptop_reports():
    """ATEN_CPU_CAPABILITY=avx2 and ONEDNN_MAX_CPU_ISA=AVX2 (how the course is measured for laptops
    on any x86 host) make the bfloat16 probe say what a real AVX2 CPU says: emulated."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX"):
        pytest.skip("an x86 host with AVX2 or better")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-m", "minispec", "info", "--device", "cpu"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "CPU capability AVX2" in out.stdout and "bfloat16: emulated" in out.stdout, out.stdout


@pytest.mark.parametrize("name, value", [("ATEN_CPU_CAPABILITY", "avx3"), ("ONEDNN_MAX_CPU_ISA", "AVX9")])
def test_an_instruction_set_variable_set_to_nonsense_is_one_line(name, value):
    with pytest.raises(ValueError, match=f"{name}='{value}': choose one of"):
        check_isa_variables({name: value})
    check_isa_variables({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "avx2"})  # case as a user types it
    env = {**os.environ, name: value}
    out = subprocess.run([sys.executable, "-m", "minispec", "info"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 2 and out.stderr.startswith(f"minispec: error: {name}=") and not out.stdout
    assert out.stderr.count("\n") == 1


def test_without_onednn_the_fast_kernels_fall_back_to_the_reference_with_one_warning(monkeypatch, caplog):
    """A torch without oneDNN (macOS arm64 builds): the default fast kernels run the reference
    x @ W, the same tokens, with one warning line per process (issue 56, item 7)."""
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    want = tiny_engine(kernels="reference")
    want_ids = [o.output_token_ids for o in (want.add_request([3, 4, 5], params) and want.run_until_done())]
    monkeypatch.setattr(kernels, "onednn_available", lambda: False)
    monkeypatch.setattr(kernels, "_FELL_BACK", [])
    with caplog.at_level(logging.WARNING, logger="minispec"):
        engines = [tiny_engine(kernels="fast") for _ in range(2)]
    assert all(e.executor.runner.kernels == "reference" for e in engines)
    assert sum("no oneDNN" in r.getMessage() for r in caplog.records) == 1
    engine = engines[0]
    engine.add_request([3, 4, 5], params)
    assert [o.output_token_ids for o in engine.run_until_done()] == want_ids
    assert "kernels reference" in engine.describe()


def test_an_emulated_format_asked_for_by_name_runs_with_one_warning(monkeypatch, caplog):
    import minispec.build.engine

    _probes(monkeypatch, "AVX2", bf16=False)
    monkeypatch.setattr(minispec.build.engine, "_WARNED_EMULATED", set())
    with caplog.at_level(logging.WARNING, logger="minispec"):
        engine = tiny_engine(kernels="fast", weights="bfloat16")
        tiny_engine(kernels="fast", weights="bfloat16")  # once per process
        tiny_engine(kernels="fast")  # the default (float32) is native: no warning
    warned = [r.getMessage() for r in caplog.records if "emulated" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("weights bfloat16 run emulated") and "AVX512-BF16" in warned[0]
    assert engine.runner.weights == "bfloat16"


def test_a_bfloat16_model_asked_for_by_dtype_warns_as_by_weights(monkeypatch, caplog):
    """--dtype bfloat16 (a model loaded in bfloat16, --weights unset) ran emulated in silence: the
    warning only looked at --weights."""
    import minispec.build.engine

    _probes(monkeypatch, "AVX2", bf16=False)
    monkeypatch.setattr(minispec.build.engine, "_WARNED_EMULATED", set())
    from minispec.base.config import EngineConfig
    from minispec.build import build_engine

    config = EngineConfig(model="tiny", device="cpu", dtype="bfloat16", num_kv_blocks=64, block_size=4,
                          max_model_len=128, kernels="fast")
    with caplog.at_level(logging.WARNING, logger="minispec"):
        engine = build_engine(config, model=LlamaModel.random(tiny_config(), seed=0))
    warned = [r.getMessage() for r in caplog.records if "emulated" in r.getMessage()]
    assert engine.runner.weights == "bfloat16" and len(warned) == 1 and "AVX512-BF16" in warned[0]


def test_describe_names_the_stack_that_runs():
    """Engine.describe() names every floor above the core a student reads (issue 55, item 3)."""
    plain = tiny_engine().describe()
    assert "engine: GuardedEngine -> Engine" in plain
    assert "-> ModelExecutor" in plain and "drafter: none" in plain and "policy: none" in plain
    assert "weights float32" in plain and "CUDA graphs off" in plain
    spec = tiny_engine(spec=SpecConfig(method="ngram", num_speculative_tokens=3)).describe()
    drafter = next(line for line in spec.splitlines() if line.startswith("drafter:"))
    assert "NgramDrafter" in drafter and drafter.endswith("inside DrafterGuard") and "policy: AlwaysPolicy" in spec


def test_the_course_runs_where_torch_has_no_onednn(tmp_path):
    """MINISPEC_ONEDNN=off takes the path of a torch built without oneDNN (macOS arm64): notebook 00
    runs in fast mode on the reference kernels, its machine card says so, and the warning is one
    line (issue 56, item 7)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "MINISPEC_ONEDNN": "off", "MINISPEC_FAST": "1", "MINISPEC_HEADLESS": "1"}
    out = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                          "--output-dir", str(tmp_path), str(root / "notebooks" / "00_quickstart.ipynb")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=root / "notebooks")
    assert out.returncode == 0, out.stderr[-2000:]
    nb = json.loads((tmp_path / "00_quickstart.ipynb").read_text())
    text = " ".join("".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                            for o in c.get("outputs", [])).split())  # printed lines are wrapped
    assert "oneDNN absent: the fast kernels fall back to the reference x @ W" in text
    assert text.count("this torch build has no oneDNN") <= 1
