"""bench/gpu_run.py (the GPU run of issue 36) on tiny shapes on a CPU, and the committed H200 run
the course reads (minispec/course/gpu.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from minispec.course.gpu import crossover_rows, layer_overhead_ms, load_gpu_results

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_run_tiny_on_cpu(tmp_path):
    """Every section runs and keeps what it promises: greedy speculation equal to plain decoding
    for every drafter, step times in both modes beside a roofline, a fitted profile, and a
    crossover with the simulator's prediction beside each measured point."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_run.py"), "--device", "cpu", "--tiny",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "gpu_cpu_tiny.json").read_text())
    assert result["errors"] == {}
    cases = result["exactness"]["cases"]
    assert len(cases) == 8 and all(c["match"] for c in cases), cases
    for shape in result["steps"].values():
        modes = {r["mode"] for r in shape["rows"]}
        assert modes == {"eager", "padded"} and all(r["step_ms"] > 0 and r["roofline_ms"] > 0 for r in shape["rows"])
    assert result["profile"]["params"]["bandwidth_bytes_per_s"] > 0
    rows = [r for r in result["crossover"]["rows"] if r["arm"] != "off"]
    assert rows and all("speedup" in r and "sim_fitted_speedup" in r for r in rows)
    assert (tmp_path / "gpu_cpu_tiny.png").exists()


def test_the_committed_h200_run_reads_as_the_course_says():
    """The H200 file holds what notebooks 01 and 05 draw: exactness on the device, T(n) of three
    shapes with graphs faster than eager at batch 1, a per-layer cost beyond the roofline, and the
    crossover beside the simulator."""
    run = load_gpu_results("h200")
    assert run["device"]["name"] == "NVIDIA H200" and not run["tiny"]
    assert all(c["match"] for c in run["exactness"]["cases"])
    for shape in run["steps"].values():
        assert shape["batch1"]["graphs_tok_s"] > shape["batch1"]["eager_tok_s"]
    per_layer = layer_overhead_ms(run)
    assert set(per_layer) == {"smollm2-135m", "llama-3.2-1b", "llama-3-8b"}
    assert all(0 < ms < 1 for ms in per_layer.values())
    assert len(crossover_rows(run)) == 24


def test_a_device_without_a_run_is_named():
    with pytest.raises(ValueError, match="no GPU run for 'b200'.*h200"):
        load_gpu_results("b200")
