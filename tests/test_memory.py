"""A finished notebook gives its memory back (issue 56, item 8): course.memory.release."""

import gc
import weakref

import matplotlib.pyplot as plt
import torch

from course.memory import release, rss_mb
from minispec.core.request import SamplingParams

from conftest import tiny_engine


def test_release_drops_models_engines_and_what_holds_them_and_keeps_the_rest():
    engine = tiny_engine()
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=2, temperature=0))
    engine.run_until_done()
    model = engine.runner.model
    refs = [weakref.ref(engine), weakref.ref(model)]
    plt.figure()
    namespace = {"engine": engine, "model": model, "arms": {"plain": engine}, "rows": [{"tok_s": 1.0}],
                 "weights": torch.zeros(4), "torch": torch, "release": release, "k": 4, "note": "kept",
                 "_": engine, "Out": {3: engine}}
    del engine, model
    out = release(namespace, quiet=True)
    gc.collect()
    assert out["released"] == ["arms", "engine", "model", "weights"]
    assert all(ref() is None for ref in refs), "an engine or its model is still alive"
    assert set(namespace) >= {"rows", "torch", "release", "k", "note"} and namespace["Out"] == {}
    assert not plt.get_fignums()


def test_rss_is_read_where_the_os_tells_it():
    value = rss_mb()
    assert value is None or value > 10
