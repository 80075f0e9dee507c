"""Stops inside accepted draft blocks: EOS, per-request stop token ids, stop strings and min_tokens.

A verify step can emit several tokens at once; when one of them ends the request, the request keeps
the tokens up to and including it, and nothing after it reaches a stream, a counter or a metric
(issue 15, fault 1). The hypothesis test walks stop position x k x drafter x kind of stop and
checks that streamed ids, usage and every counter agree with ``output_token_ids``.
"""

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minispec.build import build_engine
from minispec.config import EngineConfig, SpecConfig
from minispec.metrics import request_metrics
from minispec.models.eagle import build_eagle
from minispec.models.llama import LlamaModel
from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model
from minispec.request import SamplingParams

from conftest import KERNELS, tiny_config, tiny_engine

TARGET = LlamaModel.random(tiny_config(), seed=0)
OTHER = LlamaModel.random(tiny_config(num_layers=1), seed=5)
EAGLE = build_eagle(TARGET, torch.arange(TARGET.cfg.vocab_size)).eval().requires_grad_(False)
DRAFTERS = {"self": (SpecConfig(method="draft"), TARGET), "other": (SpecConfig(method="draft"), OTHER),
            "eagle": (SpecConfig(method="draft"), (EAGLE, None, None)), "ngram": (SpecConfig(method="ngram"), None)}


def free_run(prompt, max_tokens=24, model=TARGET, **engine_kw):
    """The target's greedy tokens with nothing stopping them (no speculation)."""
    engine = tiny_engine(model, **engine_kw)
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return engine.run_until_done()[0].output_token_ids


def spec_engine(drafter: str, k: int, model=TARGET, **kw):
    spec, draft = DRAFTERS[drafter]
    spec = SpecConfig(method=spec.method, num_speculative_tokens=k)
    return tiny_engine(model, spec=spec, draft=draft, **kw)


class PerRequestSteps:
    """An engine observer: per request, the EmittedTokens its steps handed to observers."""

    def __init__(self):
        self.outputs: dict[str, list] = {}
        self.num_accepted = 0  # StepStats.num_accepted, summed over steps

    def __call__(self, record):
        for s, out in zip(record.batch.scheduled, record.result.outputs):
            self.outputs.setdefault(s.request.request_id, []).append(out)
        self.num_accepted += record.stats.num_accepted


def run_streaming(engine, prompt, params):
    """Step a request to the end; returns (its Request, the concatenated new_token_ids, final output,
    the per-step observer)."""
    steps = engine.add_observer(PerRequestSteps())
    rid = engine.add_request(prompt, params)
    streamed, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            streamed += out.new_token_ids
            final = out
    return engine.requests[rid], streamed, final, steps


def assert_counts_agree(req, streamed, final, steps):
    """Streamed ids, usage and every speculation counter count exactly what the request kept."""
    out = req.output_token_ids
    assert streamed == out == final.output_token_ids
    assert final.finished and request_metrics(req)["num_output_tokens"] == len(out)  # usage
    emitted = steps.outputs[req.request_id]
    assert [t for o in emitted for t in o.token_ids] == out  # what observers saw is what was kept
    verifies = [o for o in emitted if o.num_draft_tokens]
    assert req.num_verify_steps == len(verifies)
    assert req.num_verify_emitted == sum(len(o.token_ids) for o in verifies) <= len(out)
    assert req.num_draft_accepted == sum(o.num_accepted for o in verifies) == sum(req.accepted_by_position)
    assert req.num_draft_accepted == steps.num_accepted
    assert req.num_draft_proposed == sum(o.num_draft_tokens for o in verifies) == sum(req.proposed_by_position)
    # a verify keeps its accepted drafts, then at most the target's own token
    assert all(len(o.token_ids) - o.num_accepted in (0, 1) and o.num_accepted <= o.num_draft_tokens
               for o in verifies)
    # the first token comes from the prefill, never from a draft
    assert req.num_draft_accepted <= len(out) - 1


def test_eos_inside_an_accepted_block_streams_and_counts_nothing_after_it():
    """The issue's smallest case: a drafter proposing the target's own greedy tokens, k 4, EOS set to
    the third greedy token: the stream ends at that token, and the counters stop there too."""
    prompt = [10, 20, 30]
    free = free_run(prompt)
    eos = free[2]
    stop_at = free.index(eos)
    engine = spec_engine("self", 4)
    engine.scheduler.eos_token_ids = frozenset({eos})
    req, streamed, final, steps = run_streaming(engine, prompt, SamplingParams(max_tokens=20, temperature=0))
    assert streamed == free[: stop_at + 1]
    assert final.finish_reason == "stop" and final.stop_reason is None  # EOS: no stop_reason, as in vLLM
    assert_counts_agree(req, streamed, final, steps)


def test_stop_token_ids_end_a_request_and_name_the_id():
    prompt = [10, 20, 30]
    free = free_run(prompt)
    stop = free[4]
    for drafter in (None, "self"):
        engine = spec_engine(drafter, 4) if drafter else tiny_engine(TARGET)
        params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[stop])
        req, streamed, final, steps = run_streaming(engine, prompt, params)
        assert streamed == free[: free.index(stop) + 1]
        assert final.finish_reason == "stop" and final.stop_reason == stop and req.stop_reason == stop
        assert_counts_agree(req, streamed, final, steps)


def test_finish_for_length_has_no_stop_reason():
    engine = tiny_engine(TARGET)
    req, _, final, _ = run_streaming(engine, [1, 2, 3], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert final.finish_reason == "length" and final.stop_reason is None


@pytest.mark.parametrize("drafter", [None, "self", "ngram"])
def test_min_tokens_ignores_eos_and_stop_ids_until_reached(drafter):
    prompt = [10, 20, 30]
    free = free_run(prompt, 30)
    eos, min_tokens = free[0], 6
    # after min_tokens - 1 tokens, the first EOS ends it (or max_tokens)
    later = [i for i in range(min_tokens - 1, len(free)) if free[i] == eos]
    expected = free[: later[0] + 1] if later else free
    for stops in (dict(), dict(stop_token_ids=[eos], ignore_eos=True)):
        engine = spec_engine(drafter, 4) if drafter else tiny_engine(TARGET)
        engine.scheduler.eos_token_ids = frozenset({eos})
        params = SamplingParams(max_tokens=30, temperature=0, min_tokens=min_tokens, **stops)
        req, streamed, final, steps = run_streaming(engine, prompt, params)
        assert streamed == expected and len(streamed) >= min_tokens
        assert_counts_agree(req, streamed, final, steps)


def test_bad_stop_token_ids_and_min_tokens_are_refused():
    with pytest.raises(ValueError, match="stop_token_ids="):
        SamplingParams(stop_token_ids=[-1])
    with pytest.raises(ValueError, match="stop_token_ids="):
        SamplingParams(stop_token_ids=[True])
    with pytest.raises(ValueError, match="min_tokens=5"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match="min_tokens=-1"):
        SamplingParams(min_tokens=-1)
    engine = tiny_engine(TARGET)
    with pytest.raises(ValueError, match="stop_token_ids must be in 0..255"):
        engine.add_request([1, 2], SamplingParams(stop_token_ids=[256]))


# -- stop strings need a tokenizer: a tiny model over the bundled tokenizer's vocabulary ---------------
TOKENIZER = load_tokenizer(resolve_model(BUNDLED_TARGET))
WIDE = LlamaModel.random(tiny_config(vocab_size=len(TOKENIZER)), seed=1)


def text_engine(drafter: str | None, k: int = 4):
    spec, draft = DRAFTERS[drafter] if drafter else (SpecConfig(), None)
    if drafter:
        spec = SpecConfig(method=spec.method, num_speculative_tokens=k)
        draft = WIDE if drafter == "self" else None
    config = EngineConfig(model="tiny", device="cpu", num_kv_blocks=64, block_size=4, max_model_len=128,
                          kernels=KERNELS, spec=spec)
    return build_engine(config, model=WIDE, tokenizer=TOKENIZER, draft=draft)


def test_stop_string_inside_an_accepted_block_names_the_string():
    prompt = [1000, 2000, 3000]
    free = free_run(prompt, 20, model=WIDE, max_model_len=128)
    text = TOKENIZER.decode(free, skip_special_tokens=True)
    stop = text[len(TOKENIZER.decode(free[:5], skip_special_tokens=True)):][:2]
    assert stop.strip(), f"pick another prompt: the text after 5 tokens starts with blanks ({text!r})"
    engine = text_engine("self")
    req, streamed, final, steps = run_streaming(engine, prompt, SamplingParams(max_tokens=20, temperature=0,
                                                                               ignore_eos=True, stop=stop))
    assert final.finish_reason == "stop" and final.stop_reason == stop
    assert final.text == text[: text.find(stop)] and stop not in final.text
    assert_counts_agree(req, streamed, final, steps)


def test_stop_token_id_is_not_in_the_text():
    prompt = [1000, 2000, 3000]
    free = free_run(prompt, 12, model=WIDE, max_model_len=128)
    stop = free[3]
    engine = text_engine(None)
    _, streamed, final, _ = run_streaming(engine, prompt, SamplingParams(max_tokens=12, temperature=0,
                                                                         ignore_eos=True, stop_token_ids=[stop]))
    kept = free[: free.index(stop) + 1]
    assert streamed == kept and final.text == TOKENIZER.decode(kept[:-1], skip_special_tokens=True)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), drafter=st.sampled_from(list(DRAFTERS)), k=st.integers(1, 6),
       kind=st.sampled_from(["eos", "stop_token_ids", "stop_string"]), stop_at=st.integers(0, 15),
       min_tokens=st.sampled_from([0, 0, 3]))
def test_stops_inside_accepted_blocks_keep_streams_and_counters_in_agreement(data, drafter, k, kind, stop_at,
                                                                            min_tokens):
    prompt = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=12))
    if kind == "stop_string":
        if drafter != "self":  # the text engine drafts with itself: the always-accepted case
            drafter = "self"
        prompt = [1000 + t for t in prompt]
        engine = text_engine(drafter, k)
        free = free_run(prompt, 24, model=WIDE, max_model_len=128)
        text = TOKENIZER.decode(free, skip_special_tokens=True)
        start = len(TOKENIZER.decode(free[:stop_at], skip_special_tokens=True))
        stop = text[start: start + 2]
        if not stop:
            stop = "\x00never"
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=stop, min_tokens=min_tokens)
    else:
        engine = spec_engine(drafter, k)
        free = free_run(prompt, 24)
        stop = free[stop_at]
        if kind == "eos":
            engine.scheduler.eos_token_ids = frozenset({stop})
            params = SamplingParams(max_tokens=24, temperature=0, min_tokens=min_tokens)
        else:
            params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop_token_ids=[stop],
                                    min_tokens=min_tokens)
    req, streamed, final, steps = run_streaming(engine, prompt, params)
    # the plain greedy run decides where it ends: the first stop at or after min_tokens
    if kind == "stop_string":
        ends = [i for i in range(max(min_tokens, 1) - 1, len(free))
                if stop in TOKENIZER.decode(free[: i + 1], skip_special_tokens=True)[
                    max(0, len(TOKENIZER.decode(free[:max(min_tokens, 1) - 1], skip_special_tokens=True))
                        - len(stop) + 1):]]
    else:
        ends = [i for i in range(max(min_tokens, 1) - 1, len(free)) if free[i] == stop]
    assert streamed == (free[: ends[0] + 1] if ends else free)
    assert final.finish_reason == ("stop" if ends else "length")
    assert_counts_agree(req, streamed, final, steps)
    # a verify that kept only accepted drafts (no bonus) was cut by the stop
    cut = any(o.num_draft_tokens and len(o.token_ids) == o.num_accepted for o in steps.outputs[req.request_id])
    event(f"stop inside accepted drafts: {cut}")
    assert engine.num_free_blocks == engine.block_manager.num_blocks
