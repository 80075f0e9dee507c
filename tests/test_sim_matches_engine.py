"""One code path, two clocks: the same workload through the real engine and the simulator gives the
same scheduled batches, step for step (requests, own tokens, draft tokens per request), with and
without prefix caching on a shared-prefix workload."""

from __future__ import annotations

from minispec.build import build_engine
from minispec.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.models.llama import LlamaModel
from minispec.request import SamplingParams
from minispec.sim import build_sim_engine
from minispec.sim.modelspec import ModelSpec

from conftest import tiny_config

PROMPT_LENS = (5, 23, 40, 9, 17, 31, 3, 12)


def scheduled_batches(engine, prompts=None) -> tuple[list, dict]:
    """Run the workload (default: distinct prompts of PROMPT_LENS tokens); return per step
    [(request id, own tokens, draft tokens, is_prefill)]."""
    batches = []
    engine.add_observer(lambda record: batches.append(
        [(s.request.request_id, s.num_own_tokens, len(s.draft_token_ids), s.is_prefill)
         for s in record.batch.scheduled]))
    prompts = prompts or [[(7 * i + j) % 200 + 1 for j in range(n)] for i, n in enumerate(PROMPT_LENS)]
    for i, prompt in enumerate(prompts):
        # explicit arrival times: the real clock and the virtual one must rank requests alike
        engine.add_request(prompt, SamplingParams(max_tokens=14 + i, temperature=0, ignore_eos=True),
                           request_id=f"r{i}", arrival_time_s=float(i))
    engine.run_until_done()
    return batches, engine.requests


def test_real_and_simulated_engines_schedule_the_same_batches():
    config = EngineConfig(model="tiny", device="cpu", seed=3, block_size=4, num_kv_blocks=26, max_model_len=96,
                          enable_prefix_caching=False,
                          scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=6),
                          spec=SpecConfig(method="synthetic", num_speculative_tokens=3, alpha=0.6))
    real = build_engine(config, model=LlamaModel.random(tiny_config(), seed=0))
    sim = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"))
    real_batches, real_requests = scheduled_batches(real)
    sim_batches, sim_requests = scheduled_batches(sim)

    # the workload exercises what the two paths could disagree on
    steps = [s for b in real_batches for s in b]
    assert any(prefill and own < PROMPT_LENS[int(rid[1:])] for rid, own, _, prefill in steps), "no chunked prefill"
    assert any(drafts for _, _, drafts, _ in steps), "no verify step"
    assert sum(r.num_preemptions for r in real_requests.values()) > 0, "no preemption"

    assert len(real_batches) == len(sim_batches)
    for i, (a, b) in enumerate(zip(real_batches, sim_batches)):
        assert a == b, f"step {i}: real {a} != simulated {b}"
    for rid, r in real_requests.items():
        s = sim_requests[rid]
        assert (r.num_output_tokens, r.num_draft_proposed, r.num_draft_accepted, r.num_preemptions) == \
            (s.num_output_tokens, s.num_draft_proposed, s.num_draft_accepted, s.num_preemptions)


def test_real_and_simulated_engines_schedule_the_same_batches_with_shared_prefixes():
    """Prefix caching on, prompts sharing a 21-token prefix (5 full blocks) or repeating whole: the
    simulator sees the real token ids, so it finds the same blocks cached, computes the same
    chunks after them and preempts the same requests (which find their own blocks again)."""
    shared = [(5 * j) % 200 + 3 for j in range(21)]
    prompts = [shared + [1, 2], shared + [9] * 7, [4] * 12, shared + [1, 2], shared[:12], shared + [8, 8, 8],
               [4] * 13, shared + [7]]
    config = EngineConfig(model="tiny", device="cpu", seed=3, block_size=4, num_kv_blocks=18, max_model_len=64,
                          scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=6),
                          spec=SpecConfig(method="synthetic", num_speculative_tokens=3, alpha=0.6))
    assert config.enable_prefix_caching
    real = build_engine(config, model=LlamaModel.random(tiny_config(), seed=0))
    sim = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"))
    real_batches, real_requests = scheduled_batches(real, prompts)
    sim_batches, sim_requests = scheduled_batches(sim, prompts)

    assert sum(r.num_cached_tokens for r in real_requests.values()) >= 3 * 20, "too few prefix hits"
    assert sum(r.num_preemptions for r in real_requests.values()) > 0, "no preemption"
    assert len(real_batches) == len(sim_batches)
    for i, (a, b) in enumerate(zip(real_batches, sim_batches)):
        assert a == b, f"step {i}: real {a} != simulated {b}"
    for rid, r in real_requests.items():
        s = sim_requests[rid]
        assert (r.num_cached_tokens, r.num_output_tokens, r.num_preemptions) == \
            (s.num_cached_tokens, s.num_output_tokens, s.num_preemptions)
    for engine in (real, sim):
        engine.block_manager.check_invariants()
        assert engine.num_free_blocks == engine.block_manager.num_blocks
