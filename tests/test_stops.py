"""Stops inside accepted draft blocks: EOS, per-request stop token ids, stop strings and min_tokens.

A verify step can emit several tokens at once; when one of them ends the request, the request keeps
the tokens up to and including it, and nothing after it reaches a stream, a counter or a metric
(issue 15, fault 1). The hypothesis test walks stop position x k x drafter x kind of stop and
checks that streamed ids, usage and every counter agree with ``output_token_ids``, and (issue 26,
class 3) that every verify keeps its accepted drafts plus one token, so the mean accepted length
is one number in request metrics, ``summarize`` and from the server's counters.
"""

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SpecConfig
from minispec.core.support.metrics import request_metrics
from minispec.models.eagle import build_eagle
from minispec.models.llama import LlamaModel
from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model
from minispec.core.request import SamplingParams

from conftest import KERNELS, tiny_config, tiny_engine

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

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
    """An engine observer: per request, the EmittedTokens its steps handed to observers and the
    drafts each step verified."""

    def __init__(self):
        self.outputs: dict[str, list] = {}
        self.drafts: dict[str, list] = {}
        self.num_draft_accepted = 0  # StepStats.num_draft_accepted, summed over steps

    def __call__(self, record):
        for s, out in zip(record.batch.scheduled, record.result.outputs):
            self.outputs.setdefault(s.request.request_id, []).append(out)
            self.drafts.setdefault(s.request.request_id, []).append(list(s.draft_token_ids))
        self.num_draft_accepted += record.stats.num_draft_accepted

    def cut_inside_drafts(self, request_id: str) -> bool:
        """Did a stop end the request on a draft the target accepted (every kept token a draft)?"""
        return any(o.token_ids and len(o.token_ids) <= len(d) and o.token_ids == d[: len(o.token_ids)]
                   for o, d in zip(self.outputs[request_id], self.drafts[request_id]))


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
    verifies = [o for o in emitted if o.num_draft_proposed]
    assert req.num_verify_steps == len(verifies)
    assert req.num_verify_emitted == sum(len(o.token_ids) for o in verifies) <= len(out)
    assert req.num_draft_accepted == sum(o.num_draft_accepted for o in verifies) == sum(req.accepted_by_position)
    assert req.num_draft_accepted == steps.num_draft_accepted
    assert req.num_draft_proposed == sum(o.num_draft_proposed for o in verifies) == sum(req.proposed_by_position)
    # a verify keeps its accepted drafts, then exactly one token: the target's own, or the one that
    # ended the request (issue 26, class 3: so every formula of the mean accepted length agrees)
    assert all(len(o.token_ids) - o.num_draft_accepted == 1 and o.num_draft_accepted <= o.num_draft_proposed for o in verifies)
    assert req.num_verify_emitted == req.num_draft_accepted + req.num_verify_steps
    if req.num_verify_steps:
        lengths = mean_accepted_lengths(req)
        assert all(v == pytest.approx(lengths["request"], rel=1e-12) for v in lengths.values()), lengths
    # the first token comes from the prefill, never from a draft
    assert req.num_draft_accepted <= len(out) - 1


def mean_accepted_lengths(req) -> dict[str, float]:
    """A request's mean accepted length as each place computes it: request metrics, ``summarize``
    (bench and simulator rows), and a client from the server's Prometheus counters."""
    from prometheus_client.parser import text_string_to_metric_families

    from minispec.tools.summary import summarize
    from minispec.serve.client_bench import _spec_stats
    from minispec.serve.metrics import ServerMetrics

    server = ServerMetrics("tiny", {"spec": "draft"})
    server.count_drafts(req.num_draft_proposed, req.num_draft_accepted, req.num_verify_steps)
    after = {s.name: s.value for f in text_string_to_metric_families(server.exposition()[0].decode())
             for s in f.samples if s.name.endswith("_total")}
    return {"request": request_metrics(req)["mean_accepted_length"],
            "summarize": summarize([req], 1.0)["mean_accepted_length"],
            "server": _spec_stats(dict.fromkeys(after, 0.0), after)["mean_accepted_length"]}


def test_eos_inside_an_accepted_block_streams_and_counts_nothing_after_it():
    """The issue's smallest case: a drafter proposing the target's own greedy tokens, k 4, EOS set to
    the third greedy token: the stream ends at that token, and the counters stop there too."""
    prompt = [10, 20, 30]
    free = free_run(prompt)
    eos = free[2]
    stop_at = free.index(eos)
    engine = spec_engine("self", 4)
    engine.stops.eos_token_ids = frozenset({eos})
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


# -- issue 26, class 3: one mean accepted length, whatever computes it -----------------------------------

@pytest.mark.parametrize("stop_at, want", [(6, 5.0), (7, 3.5), (8, 4.0)])
def test_a_stop_inside_an_accepted_block_keeps_one_mean_accepted_length(stop_at, want):
    """Self-draft, k 4: the prefill emits token 0, the first verify tokens 1-5 (4 drafts and the
    bonus), the second would emit 6-10; a stop token at ``stop_at`` cuts that block. The tokens
    kept from verifies per verify step, the request's metrics, ``summarize`` (bench rows) and
    1 + accepted / drafts from the server's counters all give one number. Before the fix the stop
    token counted as an accepted draft besides being the step's one token: stop_at 6 gave 3.0 in
    the request and 3.5 from the server (6 tokens, 5 accepted, 2 verify steps)."""
    prompt = next(p for p in ([10, 20, 30], [3, 1, 4], [2, 7, 1, 8], [5, 5, 6])
                  if (free := free_run(p))[stop_at] not in free[:stop_at])
    free = free_run(prompt)
    engine = spec_engine("self", 4)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=[free[stop_at]])
    req, streamed, final, steps = run_streaming(engine, prompt, params)
    assert streamed == free[: stop_at + 1] and steps.cut_inside_drafts(req.request_id)
    assert mean_accepted_lengths(req) == pytest.approx({"request": want, "summarize": want, "server": want})
    assert_counts_agree(req, streamed, final, steps)


def test_a_stop_inside_an_accepted_block_keeps_one_mean_accepted_length_in_the_simulator():
    """The same in the simulator, whose outputs are all DUMMY_TOKEN (0): with every draft accepted
    and k 4, a stop on token 0 from min_tokens 3 falls on the second token of the first verify."""
    from minispec.sim import build_sim_engine
    from minispec.cost.modelspec import ModelSpec

    config = EngineConfig(model="tiny", device="cpu", seed=0, block_size=4, num_kv_blocks=32, max_model_len=64,
                          spec=SpecConfig(method="synthetic", num_speculative_tokens=4, alpha=1.0))
    engine = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"))
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True, stop_token_ids=[0],
                                                       min_tokens=3))
    engine.run_until_done()
    req = engine.requests[rid]
    assert req.num_output_tokens == 3 and (req.num_verify_steps, req.num_draft_accepted) == (1, 1)
    assert mean_accepted_lengths(req) == pytest.approx({"request": 2.0, "summarize": 2.0, "server": 2.0})


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
        engine.stops.eos_token_ids = frozenset({eos})
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
                          kernels=KERNELS, weights="float32", spec=spec)
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
            engine.stops.eos_token_ids = frozenset({stop})
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
    event(f"stop inside accepted drafts: {steps.cut_inside_drafts(req.request_id)}")
    assert engine.num_free_blocks == engine.block_manager.num_blocks
