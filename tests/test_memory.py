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


def test_a_kernel_imports_no_module_it_keeps_for_nothing(bundled):
    """Issue 56, item 8: a kernel keeps every module it imported after release(), so the bundled
    model's load from its cache must not import sympy (transformers' Auto classes pulled it in through
    the architecture's config: ~55 MB), nor the course's exercises or the JSON lab's validity check
    jsonschema (~20 MB with the lark grammar its format checkers build). Run in a fresh interpreter;
    ``bundled`` has written the model's cache already."""
    import subprocess
    import sys

    code = ("import sys, torch; import course.exercises\n"
            "from minispec.models.loader import BUNDLED_TARGET, load_model\n"
            "load_model(BUNDLED_TARGET, torch.device('cpu'), torch.float32)\n"
            "from course.json_lab import is_valid_json\n"
            "assert is_valid_json('{\"a\": 1}', {'type': 'object'})\n"
            "print(sorted(m for m in ('sympy', 'jsonschema', 'lark') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_release_drops_a_closure_that_holds_an_engine_and_keeps_the_notebook_s_functions():
    """A helper that returns a lambda over its engine (course.roofline_lab.decode_stepper) left
    notebook 01's kernel holding 1,158 MB after release: a function was never dropped."""
    engine = tiny_engine()

    def stepper(e):
        return lambda: e.step()

    def here(config):  # the notebook's own function: it names globals, it closes over nothing
        return config

    ref = weakref.ref(engine)
    namespace = {"steppers": {1: stepper(engine)}, "here": here, "release": release}
    del engine
    out = release(namespace, quiet=True)
    gc.collect()
    assert out["released"] == ["steppers"] and ref() is None
    assert set(namespace) == {"here", "release"}
