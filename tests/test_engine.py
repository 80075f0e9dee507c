"""End-to-end engine behaviour on tiny random models: batching equivalence, preemption, bad input."""

import pytest
import torch

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.build import build_engine
from minispec.llm import LLM
from minispec.core.request import SamplingParams
from minispec.tools.summary import StepLog

from conftest import tiny_engine

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def prompts(n, seed=0, lo=3, hi=30):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(lo, hi, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (length,), generator=g).tolist() for length in lens]


def alone(model, prompt, params=GREEDY):
    engine = tiny_engine(model)
    engine.add_request(prompt, params)
    return engine.run_until_done()[0].output_token_ids


def test_continuous_batch_equals_each_request_alone(tiny_model):
    ps = prompts(8)
    expected = [alone(tiny_model, p) for p in ps]
    engine = tiny_engine(tiny_model, max_num_batched_tokens=16, max_num_seqs=5)
    ids = []
    for i, p in enumerate(ps):  # staggered arrivals: new prompts join a batch that is decoding
        ids.append(engine.add_request(p, GREEDY))
        engine.step()
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert [outs[i].output_token_ids for i in ids] == expected
    assert engine.num_free_blocks == engine.block_manager.num_blocks


def test_batch_equals_alone_under_preemption(tiny_model):
    ps = prompts(6, seed=3, lo=10, hi=20)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    expected = [alone(tiny_model, p, params) for p in ps]
    # 12 blocks of 4 tokens = 48 slots for 6 requests that each grow to ~40 tokens: preemption must happen
    engine = tiny_engine(tiny_model, num_kv_blocks=12, max_model_len=48, max_num_batched_tokens=32)
    ids = [engine.add_request(p, params) for p in ps]
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert sum(engine.requests[i].num_preemptions for i in ids) > 0
    assert [outs[i].output_token_ids for i in ids] == expected
    assert engine.num_free_blocks == 12


def test_sampled_output_is_reproducible_per_seed(tiny_model):
    params = SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=50, seed=123, ignore_eos=True)
    p = prompts(1)[0]
    first = alone(tiny_model, p, params)
    # the same seeded request inside a busy batch draws the same tokens
    engine = tiny_engine(tiny_model)
    for q in prompts(3, seed=9):
        engine.add_request(q, SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True))
    rid = engine.add_request(p, params)
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert outs[rid].output_token_ids == first
    other = alone(tiny_model, p, SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, top_k=50, seed=124,
                                                ignore_eos=True))
    assert other != first


def test_lanes_interactive_served_before_bulk(tiny_model):
    engine = tiny_engine(tiny_model, max_num_seqs=1)
    bulk = engine.add_request([1, 2, 3], SamplingParams(max_tokens=3, temperature=0), lane="bulk")
    inter = engine.add_request([4, 5, 6], SamplingParams(max_tokens=3, temperature=0), lane="interactive")
    engine.run_until_done()
    assert engine.requests[inter].finish_time_s <= engine.requests[bulk].first_scheduled_time_s


def test_eos_stop_string_and_max_tokens(tiny_model):
    p = prompts(1, seed=4)[0]
    free_run = alone(tiny_model, p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine = tiny_engine(tiny_model)
    engine.stops.eos_token_ids = frozenset({free_run[4]})
    rid = engine.add_request(p, SamplingParams(max_tokens=12, temperature=0))
    out = engine.run_until_done()[0]
    stop_at = free_run.index(free_run[4])
    assert out.output_token_ids == free_run[: stop_at + 1] and out.finish_reason == "stop"
    assert engine.requests[rid].num_output_tokens == stop_at + 1
    out = tiny_engine(tiny_model)
    out.add_request(p, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    res = out.run_until_done()[0]
    assert res.finish_reason == "length" and len(res.output_token_ids) == 5


def test_stop_strings_with_tokenizer(bundled):
    model, tokenizer, hf_config = bundled
    config = EngineConfig(model="bundled", device="cpu", num_kv_blocks=64, max_model_len=256)
    engine = build_engine(config, model=model, tokenizer=tokenizer, hf_config=hf_config)
    engine.add_request("One, two, three, four, five, six,", SamplingParams(max_tokens=16, temperature=0))
    full = engine.run_until_done()[0].text
    stop = full.strip()[:4].strip() or full[:2]
    engine.add_request("One, two, three, four, five, six,", SamplingParams(max_tokens=16, temperature=0, stop=stop))
    out = engine.run_until_done()[0]
    assert out.finish_reason == "stop" and stop not in out.text and full.startswith(out.text)


def test_abort_frees_blocks_and_unknown_id_is_an_error(tiny_model):
    engine = tiny_engine(tiny_model)
    a = engine.add_request(prompts(1)[0], GREEDY)
    b = engine.add_request(prompts(1, seed=1)[0], GREEDY)
    engine.step(); engine.step()
    assert engine.block_manager.num_used_blocks > 0
    out = engine.abort(a)
    assert out.finished and out.finish_reason == "abort"
    engine.abort(b)
    assert engine.num_free_blocks == engine.block_manager.num_blocks and not engine.has_unfinished()
    with pytest.raises(ValueError, match="unknown request id 'nope'"):
        engine.abort("nope")


@pytest.mark.parametrize("refused", [dict(lane="vip"), dict(prompt=[]), dict(prompt=[300]),
                                     dict(params=SamplingParams(stop_token_ids=[999]))],
                         ids=["unknown-lane", "empty-prompt", "id-outside-vocab", "stop-id-outside-vocab"])
def test_a_refused_request_leaves_its_neighbours_randomness_alone(tiny_model, refused):
    """Issue 26, class 5: add_request checks everything before it draws a seed from the engine's
    generator; a lane check that came after the draw gave the next unseeded request other tokens."""
    sampled = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)

    def run(refuse: bool):
        engine = tiny_engine(tiny_model)
        if refuse:
            with pytest.raises(ValueError):
                engine.add_request(refused.get("prompt", [1, 2, 3]), refused.get("params", sampled),
                                   lane=refused.get("lane", "interactive"))
        rid = engine.add_request([1, 2, 3], sampled)
        return engine.requests[rid].seed, engine.run_until_done()[0].output_token_ids

    assert run(refuse=True) == run(refuse=False)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens=0"),
    (dict(temperature=-0.5), "temperature=-0.5"),
    (dict(top_p=0.0), "top_p=0.0"),
    (dict(top_p=1.5), "top_p=1.5"),
    (dict(top_k=-1), "top_k=-1"),
    (dict(num_speculative_tokens=40), "num_speculative_tokens=40"),
])
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_bad_prompts(tiny_model):
    engine = tiny_engine(tiny_model, max_model_len=32)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request([])
    with pytest.raises(ValueError, match="prompt has 40 tokens but max_model_len is 32"):
        engine.add_request([1] * 40)
    with pytest.raises(ValueError, match="lane 'vip' is unknown"):
        engine.add_request([1, 2], lane="vip")
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.add_request("hello")
    with pytest.raises(ValueError, match="token ids must be in 0..255"):
        engine.add_request([1, 999])
    assert not engine.has_unfinished()


def test_bad_engine_configs(tiny_model):
    with pytest.raises(ValueError, match="cannot hold one request of max_model_len=128"):
        tiny_engine(tiny_model, num_kv_blocks=8)
    with pytest.raises(ValueError, match="is not an alias"):
        build_engine(EngineConfig(model="no-such-model", device="cpu"))
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        build_engine(EngineConfig(model="no-such-model", device="cpu"))
    with pytest.raises(ValueError, match="block_size=0"):
        EngineConfig(block_size=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens=0"):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="without chunked prefill"):
        tiny_engine(tiny_model, max_num_batched_tokens=16, enable_chunked_prefill=False)
    with pytest.raises(ValueError, match="spec method 'medusa' is unknown"):
        SpecConfig(method="medusa")
    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match=rf"draft_confidence_threshold={bad!r}: must be a number in \[0, 1\)"):
            SpecConfig(method="draft", draft_confidence_threshold=bad)


def test_chunked_prefill_spreads_a_long_prompt(tiny_model):
    engine = tiny_engine(tiny_model, max_num_batched_tokens=8)
    log = engine.add_observer(StepLog())
    engine.add_request(list(range(1, 30)), SamplingParams(max_tokens=2, temperature=0))
    engine.run_until_done()
    prefill_steps = [s for s in log.stats if s.num_prefill_tokens]
    assert [s.num_prefill_tokens for s in prefill_steps] == [8, 8, 8, 5]
    assert all(s.num_tokens <= 8 for s in log.stats)


def test_decodes_are_scheduled_before_prompt_chunks(tiny_model):
    engine = tiny_engine(tiny_model, max_num_batched_tokens=10)
    log = engine.add_observer(StepLog())
    for _ in range(3):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    engine.step()  # three short prompts prefill together
    engine.add_request(list(range(1, 40)), SamplingParams(max_tokens=2, temperature=0))
    engine.step()
    last = log.stats[-1]
    assert last.num_decode_tokens == 3 and last.num_prefill_tokens == 7


def test_failed_step_fails_its_requests_and_frees_blocks(tiny_model):
    engine = tiny_engine(tiny_model)
    rid = engine.add_request([1, 2, 3], GREEDY)

    def boom(batch):
        raise RuntimeError("device lost")

    engine.executor.execute = boom
    outs = engine.step()
    assert outs[0].finish_reason == "error" and "device lost" in outs[0].error
    assert engine.requests[rid].finished and engine.num_free_blocks == engine.block_manager.num_blocks


def test_llm_generate_on_chat_and_text(bundled):
    model, tokenizer, hf_config = bundled
    # reuse the loaded weights instead of loading them again
    llm = LLM.from_engine(build_engine(EngineConfig(model="bundled", device="cpu", num_kv_blocks=128, max_model_len=512),
                                       model=model, tokenizer=tokenizer, hf_config=hf_config))
    outs = llm.generate([[{"role": "user", "content": "What is the capital of France?"}], "2 + 2 ="],
                        SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)
    assert "Paris" in outs[0].text and outs[0].finish_reason == "stop"
    assert len(outs[1].output_token_ids) == 12
    m = llm.metrics()
    assert m["num_finished"] == 2 and m["throughput_tok_s"] > 0


def test_dropped_engine_frees_its_kv_pool_without_the_cycle_collector(tiny_model):
    # the scheduler once held a bound method of the engine (its stop-string check): a reference
    # cycle that kept every dropped engine's KV pool allocated until the cycle collector ran
    import gc
    import weakref

    from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model

    tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
    engine = build_engine(EngineConfig(model="tiny", device="cpu", num_kv_blocks=16, max_model_len=64),
                          model=tiny_model, tokenizer=tokenizer)
    assert engine.stops.detokenize is not None
    kv_pool = weakref.ref(engine.runner.kv_cache.k)
    gc.disable()
    try:
        del engine
        assert kv_pool() is None
    finally:
        gc.enable()


def poison(engine, bad_id: str, after_tokens: int = 0) -> None:
    """Make the target's forward raise whenever request ``bad_id`` rides it (once it has
    ``after_tokens`` output tokens): a failure that belongs to one request only."""
    runner = engine.runner
    forward = runner.forward

    def guarded(items, **kw):
        bad = engine.requests[bad_id]
        if bad.num_output_tokens >= after_tokens and any(item.request_id == bad_id for item in items):
            raise RuntimeError(f"cannot compute request {bad_id}")
        return forward(items, **kw)

    runner.forward = guarded


@pytest.mark.parametrize("speculate", [False, True])
def test_a_failure_pinned_to_one_request_fails_only_that_request(tiny_model, speculate):
    """Issue 15, fault 2: the step is retried request by request; only the one at fault fails, and
    its neighbours (greedy and seeded sampling) get exactly the tokens they get alone."""
    ps = prompts(4, seed=5)
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=7, ignore_eos=True)
    params = [GREEDY, sampled, GREEDY, sampled]
    spec = SpecConfig(method="draft", num_speculative_tokens=3) if speculate else None
    draft = tiny_model if speculate else None

    def run(with_bad: bool):
        engine = tiny_engine(tiny_model, spec=spec, draft=draft)
        ids = [engine.add_request(p, q) for p, q in zip(ps, params)]
        if with_bad:
            bad = engine.add_request([9, 8, 7, 6], GREEDY, request_id="bad")
            poison(engine, bad, after_tokens=3)
        outs = {o.request_id: o for o in engine.run_until_done()}
        assert engine.num_free_blocks == engine.block_manager.num_blocks
        return [outs[i] for i in ids], outs.get("bad"), engine

    expected, _, _ = run(False)
    got, bad, engine = run(True)
    assert [o.output_token_ids for o in got] == [o.output_token_ids for o in expected]
    assert all(o.finish_reason == "length" and o.error is None for o in got)
    assert bad.finish_reason == "error" and "cannot compute request bad" in bad.error
    assert len(bad.output_token_ids) >= 3  # what it had when it failed stays


def test_a_failure_is_marked_on_the_steps_result_and_the_core_step_has_no_error_channel(tiny_model):
    """Issue 45, item 4: the core ``Engine.step`` passed an ``errors`` dict through ``_execute``
    and ``_keep``, and the guard filled it by side effect. Now the guard marks a failed request on
    the step's result (``EmittedTokens.error``), observers see the mark, and the scheduler ends
    the request with it; the core's ``_execute`` and ``_keep`` take no error argument."""
    import inspect

    from minispec.core.engine import Engine

    assert list(inspect.signature(Engine._keep).parameters) == ["self", "s", "out"]
    engine = tiny_engine(tiny_model)
    good = engine.add_request([1, 2, 3, 4], GREEDY)
    bad = engine.add_request([9, 8, 7, 6], GREEDY, request_id="bad")
    poison(engine, bad, after_tokens=2)
    marks = []
    engine.add_observer(lambda rec: marks.extend(
        (s.request.request_id, out.error) for s, out in zip(rec.batch.scheduled, rec.result.outputs)
        if out.error is not None))
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert len(marks) == 1 and marks[0][0] == "bad" and "cannot compute request bad" in marks[0][1]
    assert outs["bad"].finish_reason == "error" and outs["bad"].error == marks[0][1]
    assert outs[good].error is None and len(outs[good].output_token_ids) == 12
    assert engine.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("speculate", [False, True])
def test_an_empty_batch_executes_to_an_empty_result(tiny_model, speculate):
    """Issue 41, item 8: ``ModelExecutor.execute(Batch([]))`` raised AttributeError (paged attention
    returned None for a step without attention groups). An empty batch answers an empty result."""
    from minispec.core.batch import Batch

    spec = SpecConfig(method="draft", num_speculative_tokens=3) if speculate else None
    engine = tiny_engine(tiny_model, spec=spec, draft=tiny_model if speculate else None)
    result = engine.executor.execute(Batch([]))
    assert result.outputs == [] and result.forward.logits == []
    engine.add_request([1, 2, 3], GREEDY)  # and the engine runs on as before
    assert len(engine.run_until_done()[0].output_token_ids) == 12


@pytest.mark.parametrize("bad", [[], [1, 2, 10**7]], ids=["empty", "id outside the vocabulary"])
def test_a_batch_with_one_bad_prompt_queues_nothing(bad):
    """LLM.generate checks every prompt before it queues any: a refused batch leaves no request
    behind for the next call to run and return (issue 59: req-0 used to stay waiting)."""
    engine = tiny_engine()
    llm = LLM.from_engine(engine)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with pytest.raises(ValueError, match="empty|vocabulary|0..255"):
        llm.generate([[5, 6, 7], bad], params, use_tqdm=False)
    assert not engine.has_unfinished() and not engine.requests
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    outs = llm.generate([[8, 9]], params, use_tqdm=False)
    assert len(outs) == 1 and list(engine.requests) == [outs[0].request_id]
    assert llm.metrics()["num_finished"] == 1


def test_a_workload_with_one_bad_prompt_sends_nothing():
    """The closed-loop and Poisson runs (bench's prompt files) check each prompt before sending any,
    and name the bad prompt's index (issue 59)."""
    from minispec.tools.workload import run_closed_loop, run_poisson

    engine = tiny_engine()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    with pytest.raises(ValueError, match="prompt 2: .*0..255"):
        run_closed_loop(engine, [[1, 2], [3, 4], [5, 10**7]], concurrency=2, num_requests=6, params=params)
    with pytest.raises(ValueError, match="prompt 1: prompt is empty"):
        run_poisson(engine, [[1, 2], []], qps=100.0, num_requests=4, params=params)
    assert not engine.requests and not engine.has_unfinished()
