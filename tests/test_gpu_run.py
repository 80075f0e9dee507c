"""bench/gpu/gpu_run.py (the GPU run of issue 36) on tiny shapes on a CPU, and the committed H200 run
the course reads (course/gpu.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course.gpu import crossover_rows, layer_overhead_ms, load_gpu_results

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_run_tiny_on_cpu(tmp_path):
    """Every section runs and keeps what it promises: greedy speculation equal to plain decoding
    for every drafter, step times in both modes beside a roofline, a fitted profile, and a
    crossover with the simulator's prediction beside each measured point."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "gpu_run.py"), "--device", "cpu", "--tiny",
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


def test_minispecs_h200_mode_is_fitted_from_the_runs_steps():
    """minispec/sim/engine_fit.py on the committed run: a per-layer floor of tens of microseconds
    (the three shapes' batch-1 decodes), eager layers dearer than replayed ones, efficiencies from
    the measured ceilings; the hardware file's stored mode is that fit."""
    from minispec.sim.engine_fit import fit_engine_mode
    from minispec.cost.hardware import load_hardware

    run, peak = load_gpu_results("h200"), load_hardware("h200")
    mode = fit_engine_mode(run, peak)
    assert 30e-6 < mode["layer_overhead_s"] < 200e-6
    assert mode["eager_layer_overhead_s"] > 5 * mode["layer_overhead_s"]
    assert 0.7 < mode["bandwidth_efficiency"] <= 1 and 0.5 < mode["compute_efficiency"] <= 1
    stored = load_hardware("h200@minispec-cuda-graphs")
    for key in ("layer_overhead_s", "eager_layer_overhead_s", "step_overhead_s", "request_overhead_s"):
        assert getattr(stored, key) == pytest.approx(mode[key], rel=1e-6)
    assert stored.graph_max_query == 32 and stored.draft_request_overhead_s > 0


def test_the_fitted_mode_predicts_the_measured_crossover_within_its_bound():
    """A regression guard on bench/gpu/gpu_fit.py: the H200 crossover (23 predicted points, one fitted)
    stays within the error this session reached (median 8%, every point of the 1B draft arm within
    30%); a change to the cost model that loses that accuracy fails here."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from gpu_fit import compare, simulate_crossover, summary
    from minispec.cost.hardware import load_hardware

    run = load_gpu_results("h200")
    rows = compare(run, simulate_crossover(run, load_hardware("h200@minispec-cuda-graphs")), ("1B draft a=0.8", 128))
    assert summary(rows)["median_abs_speedup_error"] <= 0.10
    assert all(abs(r["error"]) <= 0.30 for r in rows if r["arm"] == "1B draft a=0.8")
