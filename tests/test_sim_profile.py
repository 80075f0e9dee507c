"""profile: the fit recovers known parameters, and a measurement runs end to end on a tiny model."""

from __future__ import annotations

import json

import pytest

from minispec.build import build_engine
from minispec.sim import profile
from minispec.cost.model import CostModel
from minispec.cost.hardware import HardwareSpec, load_hardware
from minispec.cost.modelspec import load_model_spec
from minispec.sim.profile import ProfilePoint, fit, hardware_from_fit, measure, unit_hardware


def synthetic_points(hw: HardwareSpec) -> list[ProfilePoint]:
    spec = load_model_spec("smollm2-135m", "float32")
    unit, true = CostModel(unit_hardware(), spec), CostModel(hw, spec)
    shapes = [("decode", b, k, ctx, [(1 + k, ctx, 1 + k)] * b) for b in (1, 4, 16, 64) for k in (0, 4)
              for ctx in (32, 512)]
    shapes += [("prefill", 1, 0, chunk, [(chunk, chunk, 1)]) for chunk in (64, 256)]
    points = []
    for kind, b, k, ctx, items in shapes:
        f = unit.features(items)
        points.append(ProfilePoint(kind, b, k, ctx, f["num_tokens"], f["linear_flops"], f["attention_flops"],
                                   f["weight_bytes"], f["other_bytes"], true.items_cost(items).time_s))
    return points


@pytest.mark.parametrize("knobs", [dict(), dict(overlap=0.0, attention_efficiency=0.25, extra_weight_reads=1.25)])
def test_fit_recovers_known_parameters(knobs):
    hw = HardwareSpec("known", "known", 50e9, 10e9, 16e9, compute_efficiency=1.0, bandwidth_efficiency=1.0,
                      step_overhead_s=5e-3, request_overhead_s=2e-4, **knobs)
    params = fit(synthetic_points(hw))
    assert params["bandwidth_bytes_per_s"] == pytest.approx(10e9, rel=0.03)
    assert params["flops_per_s"] == pytest.approx(50e9, rel=0.05)
    assert params["step_overhead_s"] == pytest.approx(5e-3, rel=0.05)
    assert params["request_overhead_s"] == pytest.approx(2e-4, rel=0.05)
    for key in ("overlap", "attention_efficiency", "extra_weight_reads"):
        assert params[key] == getattr(hw, key)
    assert params["rms_rel_error"] < 0.01


def test_fit_needs_points():
    with pytest.raises(ValueError, match="at least 4"):
        fit(synthetic_points(load_hardware("h100"))[:3])


KNOWN_BANDWIDTH, KNOWN_FLOPS = 10e9, 50e9


@pytest.fixture
def known_clock(monkeypatch):
    """Each timed step takes the time a known roofline gives its measured shape, not the wall clock's.

    On a tiny model a step is mostly Python, and a busy CI machine's noise can outgrow the part that
    grows with bytes (a run once timed prefill below decode, so the fit found no bandwidth); these
    tests check measuring, fitting and saving, not this machine's speed.
    """
    real = profile._time_step

    def time_step(engine, probe, kind, k):
        p = real(engine, probe, kind, k)
        work = max((p.weight_bytes + p.other_bytes) / KNOWN_BANDWIDTH,
                   (p.linear_flops + p.attention_flops) / KNOWN_FLOPS)
        return profile.replace(p, time_s=2e-3 + 1e-4 * p.num_requests + work)

    monkeypatch.setattr(profile, "_time_step", time_step)


def test_measure_on_a_tiny_random_model_writes_a_loadable_spec(tmp_path, known_clock):
    config = tmp_path / "config.json"
    # big enough (32 MB of float32 weights) that weight reads, not Python overhead alone, set step time
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 8192, "hidden_size": 256,
                                  "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "max_position_embeddings": 512}))
    points, spec, info = measure(build_engine, f"random:{config}", "cpu", "float32", batch_sizes=(1, 4), ks=(0, 2),
                                 contexts=(8, 32), prefill_chunks=(16,), num_steps=2, progress=lambda line: None)
    assert spec.num_layers == 4 and info["dtype"] == "float32"
    assert {p.num_tokens for p in points if p.kind == "decode"} >= {1, 3, 4, 12}
    params = fit(points)
    # every decode step of this small grid reads the same weights, so bandwidth and overheads trade
    # off a little; the fit must still reproduce the steps
    assert params["rms_rel_error"] < 0.02
    assert params["bandwidth_bytes_per_s"] == pytest.approx(KNOWN_BANDWIDTH, rel=0.15)
    hw = hardware_from_fit(params, info, points)
    path = tmp_path / "this.json"
    path.write_text(json.dumps(hw.to_dict()))
    loaded = load_hardware(str(path))
    assert loaded.name == "this" and loaded.default_dtype == "float32" and loaded.fit["num_points"] == len(points)


def test_cli_profile_smoke(tmp_path, capsys, known_clock):
    from minispec.cli import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 8192, "hidden_size": 256,
                                  "intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "max_position_embeddings": 512}))
    out, points = tmp_path / "this.json", tmp_path / "points.json"
    rc = main(["profile", "--model", f"random:{config}", "--device", "cpu", "--batch-sizes", "1,4", "--ks", "0,2",
               "--contexts", "8", "--prefill-chunks", "16", "--steps", "2", "--output", str(out),
               "--json", str(points)])
    assert rc == 0
    assert load_hardware(str(out)).name == "this"
    assert json.loads(points.read_text())["info"]["dtype"] == "float32"
    assert "measured ms" in capsys.readouterr().out
    assert main(["profile", "--ks", "0,99", "--output", str(out)]) == 2
    assert main(["profile", "--spec", "ngram", "--output", str(out)]) == 2  # the grid's --ks, not a drafter


def test_profile_profiles_the_step_its_engine_flags_name(tmp_path, monkeypatch):
    """``profile --kernels reference --compile off`` (and --weights, --cuda-graphs) were parsed and
    then dropped: every profile timed the default step. The flags now reach every engine it builds."""
    from minispec.cli import main
    import minispec.cli.profile as cli_profile

    class Stop(Exception):
        pass

    seen = {}

    def fake_measure(*args, engine_options=None, **kwargs):
        seen.update(engine_options)
        raise Stop

    monkeypatch.setattr(cli_profile, "measure", fake_measure)
    with pytest.raises(Stop):
        main(["profile", "--kernels", "reference", "--compile", "off", "--output", str(tmp_path / "x.json")])
    assert seen == {"kernels": "reference", "weights": None, "cuda_graphs": None, "compile": False}
    built = []

    def spy(config, *args, **kwargs):
        built.append((config.kernels, config.compile))
        return build_engine(config, *args, **kwargs)

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "vocab_size": 512, "hidden_size": 64,
                                  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "max_position_embeddings": 256}))
    measure(spy, f"random:{config}", "cpu", "float32", batch_sizes=(1,), ks=(0,), contexts=(8,),
            prefill_chunks=(16,), num_steps=1, engine_options={"kernels": "reference"}, progress=lambda line: None)
    assert built and set(built) == {("reference", None)}
