"""bench/peers/decode_profile.py's rows probe on a tiny random model: one time per format and row count,
and the model's own weights untouched (the probe drops each format's packed copy when done)."""

import torch

from minispec.models import kernels
from minispec.models.llama import LlamaModel

from conftest import load_bench_script, tiny_config


def test_the_rows_probe_times_every_format_and_row_count_and_keeps_no_copy():
    module = load_bench_script("decode_profile")
    model = LlamaModel.random(tiny_config(), seed=0)
    before = [p.clone() for p in model.parameters()]
    table = module.rows_probe(model, formats=("int4", "float32"), rows=(1, 5), repeats=2)
    assert set(table) == {"int4", "float32"} and all(set(t) == {1, 5} for t in table.values())
    assert all(ms > 0 for t in table.values() for ms in t.values())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not kernels._PREPARED.get(model)
