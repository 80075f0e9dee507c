"""The course's claims as workloads (course/claims.py), on the simulator's virtual clock:
deterministic, so each claim's direction is asserted, and on the real engine with a tiny model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import tiny_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from course.claims import chunking_and_speculation, neighbours, throughput
from minispec.core.request import SamplingParams
from minispec.sim import build_sim_engine

PROMPT = [[0] * 512]


def h100(config: EngineConfig, draft: str = "llama-3.2-1b"):
    return build_sim_engine(replace(config, max_model_len=config.max_model_len or 32768), hardware="h100",
                            model="llama-3-8b", draft=draft)


def modelled(alpha: float) -> SpecConfig:
    return SpecConfig(method="draft", num_speculative_tokens=4, alpha=alpha)


def test_a_speculating_lane_slows_the_lane_that_does_not_speculate():
    config = EngineConfig(spec=modelled(0.8), scheduler=SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=256))
    r = neighbours(h100, config, PROMPT, 64, 64, 64)
    plain, spec = r["plain"], r["speculating"]
    assert spec["bulk"]["tpot_p50_s"] > 1.05 * plain["bulk"]["tpot_p50_s"]   # fatter steps for the bulk lane
    assert spec["interactive"]["tpot_p50_s"] < spec["bulk"]["tpot_p50_s"]    # the premium lane still gains


def test_chunking_bounds_the_stall_and_speculation_speeds_decode():
    r = chunking_and_speculation(h100, EngineConfig(spec=modelled(0.8)), PROMPT * 16, [0] * 8000, 1024, 64)
    assert set(r) == {(False, False), (True, False), (False, True), (True, True)}
    for speculating in (False, True):   # chunking: the largest gap a decoder sees shrinks
        assert r[(True, speculating)]["itl_max_s"] < 0.5 * r[(False, speculating)]["itl_max_s"]
    for chunked in (False, True):       # speculation: decode TPOT falls at this low load
        assert r[(chunked, True)]["tpot_p50_s"] < r[(chunked, False)]["tpot_p50_s"]


def test_a_costly_draft_takes_more_device_time_and_loses_at_concurrency_1():
    cheap = throughput(h100, EngineConfig(spec=modelled(0.6)), PROMPT, 1, 4, 64)
    costly = throughput(lambda c: h100(c, draft="llama-3.1-8b"), EngineConfig(spec=modelled(0.6)), PROMPT, 1, 4, 64)
    off = throughput(h100, EngineConfig(), PROMPT, 1, 4, 64)
    assert costly["draft_time_share"] > 2 * cheap["draft_time_share"]
    assert costly["throughput_tok_s"] < off["throughput_tok_s"] < cheap["throughput_tok_s"]
    assert off["draft_time_share"] is None


def test_the_workloads_run_on_the_real_engine():
    def build(config):
        s = config.scheduler
        return tiny_engine(spec=config.spec, max_model_len=config.max_model_len or 256, num_kv_blocks=128,
                           max_num_batched_tokens=s.max_num_batched_tokens, max_num_seqs=s.max_num_seqs,
                           enable_chunked_prefill=s.enable_chunked_prefill)

    prompts = [list(range(3, 20)), list(range(5, 30))]
    ngram = SpecConfig(method="ngram", num_speculative_tokens=2)
    r = neighbours(build, EngineConfig(spec=ngram), prompts, 2, 2, 8)
    assert all(r[run][lane]["tpot_p50_s"] > 0 for run in r for lane in ("interactive", "bulk"))
    grid = chunking_and_speculation(build, EngineConfig(spec=ngram), prompts, list(range(3, 90)), 32, 8)
    assert all(v["long_ttft_s"] > 0 for v in grid.values())
    assert throughput(build, EngineConfig(), prompts, 2, 4, 8)["num_finished"] == 4


@pytest.mark.parametrize("bad", [0, -1])
def test_throughput_rejects_a_bad_concurrency(bad):
    with pytest.raises(ValueError, match="concurrency"):
        throughput(h100, EngineConfig(), PROMPT, bad, 4, 8)


def test_throughput_lets_eos_end_a_real_request():
    """Failed before EOS was honoured: every request ran to max_tokens past its answer, text a real
    model tends to repeat and an n-gram drafter then predicts too well."""
    prompts = [list(range(3, 20))]
    probe = tiny_engine(max_model_len=256, num_kv_blocks=128)
    rid = probe.add_request(prompts[0], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    probe.run_until_done()
    eos = probe.requests[rid].output_token_ids[2]  # the third greedy token ends the answer

    def build(config):
        engine = tiny_engine(spec=config.spec, max_model_len=256, num_kv_blocks=128)
        engine.stops.eos_token_ids = frozenset({eos})
        return engine

    for spec in (SpecConfig(), SpecConfig(method="ngram", num_speculative_tokens=2)):
        honoured = throughput(build, EngineConfig(spec=spec), prompts, 1, 2, 8)
        assert honoured["num_output_tokens"] == 2 * 3
        assert throughput(build, EngineConfig(spec=spec), prompts, 1, 2, 8, ignore_eos=True)["num_output_tokens"] == 16


def test_a_part_that_rounds_to_zero_prints_without_a_minus_sign():
    from course.claims import explain_cost
    text = explain_cost({"draft_s": 0.00734, "verify_s": 0.00223, "other_s": -4e-7, "step_s": 0.00957,
                         "plain_step_s": 0.0085, "cause": "the drafter's forwards"})
    assert "-0.00" not in text and "the rest 0.00 ms" in text and "8.50 -> 18.07 ms" in text
