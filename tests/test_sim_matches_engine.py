"""One code path, two clocks: the same workload through the real engine and the simulator gives the
same scheduled batches, step for step (requests, own tokens, draft tokens per request), with and
without prefix caching on a shared-prefix workload, in a nearly full pool and in a roomy one
(where the pool's eviction policy, the one of the device the simulator models, decides the hits)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from minispec.build import build_engine
from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.sim import build_sim_engine
from minispec.cost.hardware import load_hardware
from minispec.cost.modelspec import ModelSpec

from conftest import tiny_config

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

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


# -- issue 26, class 2: equal arrival times preempt the request added last ------------------------------

def preemption_run(clock: str, arrival_time_s: float | None) -> tuple[list, list]:
    """Three requests outgrow a pool of 12 blocks on the ``clock`` ("real" or "virtual") engine,
    arriving at ``arrival_time_s`` (None: the engine's clock, which the virtual one does not move
    between adds). Returns (the scheduled batches as in ``scheduled_batches``, the victims in order)."""
    config = EngineConfig(model="tiny", device="cpu", seed=0, block_size=4, num_kv_blocks=12, max_model_len=48)
    engine = (build_engine(config, model=LlamaModel.random(tiny_config(), seed=0)) if clock == "real" else
              build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32")))
    batches, victims = [], []

    def observe(record):
        batches.append([(s.request.request_id, s.num_own_tokens, s.is_prefill) for s in record.batch.scheduled])
        victims.extend(r.request_id for r in record.batch.preempted)

    engine.add_observer(observe)
    for i in range(3):
        engine.add_request([i + 1] * 6, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
                           request_id=f"r{i}", arrival_time_s=arrival_time_s)
    engine.run_until_done()
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    return batches, victims


@pytest.mark.parametrize("clock", ["real", "virtual"])
@pytest.mark.parametrize("arrival_time_s", [5.0, None], ids=["tied", "clock"])
def test_equal_arrival_times_preempt_the_request_added_last(clock, arrival_time_s):
    """The victim is the newest request (the last added) also when arrival times tie: explicitly,
    or because the simulator's clock stands still while closed-loop clients are added. ``max``
    over arrival time alone kept the first of equal keys and preempted the oldest."""
    _, victims = preemption_run(clock, arrival_time_s)
    assert victims and victims[0] == "r2", victims


def test_closed_loop_clients_preempt_alike_on_both_clocks():
    """Requests added at the engine's own clock: the real one gives each its own time, the virtual
    one gives all of them 0; both engines must still schedule the same batches."""
    real_batches, real_victims = preemption_run("real", None)
    sim_batches, sim_victims = preemption_run("virtual", None)
    assert real_victims == sim_victims and real_batches == sim_batches

# -- issue 26, class 1: the draft keeps only K/V the target kept, on both clocks ------------------------

@pytest.mark.parametrize("clock", ["real", "virtual"])
def test_draft_progress_counts_only_kv_the_target_kept(clock):
    """After every step, verify or plain, a draft model counts as valid only K/V of committed
    tokens: never past the target's ``num_computed_tokens``. The real drafter and the simulator's
    draft cost share DraftProgress; before the fix a plain step after a verify kept the rejected
    drafts' positions counted (the next proposal drafted from them, and the simulator charged too
    little catch-up)."""
    from test_spec_exactness import ScriptedK

    config = EngineConfig(model="tiny", device="cpu", seed=0, block_size=4, num_kv_blocks=64, max_model_len=96,
                          spec=SpecConfig(method="draft", num_speculative_tokens=4, alpha=0.5))
    policy = ScriptedK([4, 0, 3, 0, 0, 2])
    if clock == "real":
        engine = build_engine(config, model=LlamaModel.random(tiny_config(), seed=0), policy=policy,
                              draft=LlamaModel.random(tiny_config(num_layers=1), seed=5))
        progress = engine.drafter.inner.progress
    else:
        engine = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"),
                                  draft=ModelSpec.of(tiny_config(num_layers=1), "float32"), policy=policy)
        progress = engine.executor.draft_progress
    for i in range(3):
        engine.add_request([i + 1, 7, 3], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
        for rid, num_cached in progress.num_cached.items():
            assert num_cached <= engine.requests[rid].num_computed_tokens, rid
    reqs = engine.requests.values()
    # verifies that rejected drafts the draft had computed K/V for, each followed by plain steps
    assert sum(r.num_draft_proposed - r.num_draft_accepted for r in reqs) > 10
    assert not progress.num_cached


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


# -- issue 32, class 3: the simulator's pool evicts as the engine's does on the device it models -------

def test_a_roomy_pool_with_prefix_caching_schedules_alike_on_the_device_modelled():
    """Two shared prefixes taking turns, one request at a time, in a pool with room to spare. The
    real engine runs on a CPU, whose pool commits memory as blocks are first used, so a new block
    evicts a cached one first (``memory_follows_use``): a prefix survives only until the next
    request needs blocks. A simulator modelling a CPU evicts alike and schedules the same batches
    with the same hits; one modelling an H100 (its pool allocated up front) keeps both prefixes
    and finds more. Before the fix every simulator kept cached blocks until the pool was full:
    the CPU engine found 40 cached tokens where the simulator found 80."""
    a = [(5 * j) % 200 + 3 for j in range(21)]
    b = [(11 * j) % 190 + 2 for j in range(21)]
    prompts = [a + [1, 2], a + [4, 4], b + [3], a + [8], b + [5, 6, 7], b + [9, 9]]
    config = EngineConfig(model="tiny", device="cpu", seed=3, block_size=4, num_kv_blocks=64, max_model_len=64,
                          scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=1),
                          spec=SpecConfig(method="synthetic", num_speculative_tokens=3, alpha=0.6))
    h100 = load_hardware("h100")
    cpu = replace(h100, name="a-cpu", device_type="cpu")
    real = build_engine(config, model=LlamaModel.random(tiny_config(), seed=0))
    sims = {hw.device_type: build_sim_engine(config, hardware=hw, model=ModelSpec.of(tiny_config(), "float32"))
            for hw in (cpu, h100)}
    real_batches, real_requests = scheduled_batches(real, prompts)
    sim_batches, sim_requests = scheduled_batches(sims["cpu"], prompts)
    _, gpu_requests = scheduled_batches(sims["cuda"], prompts)

    def cached(requests):
        return [requests[f"r{i}"].num_cached_tokens for i in range(len(prompts))]

    assert sum(cached(real_requests)) > 0, "no prefix hit on the CPU"
    assert sum(cached(gpu_requests)) > sum(cached(real_requests)), "the two eviction policies were not told apart"
    assert cached(sim_requests) == cached(real_requests)
    assert len(real_batches) == len(sim_batches)
    for i, (x, y) in enumerate(zip(real_batches, sim_batches)):
        assert x == y, f"step {i}: real {x} != simulated {y}"
    for engine in (real, *sims.values()):
        engine.block_manager.check_invariants()
        assert engine.num_free_blocks == engine.block_manager.num_blocks


# -- issue 34: a draft's catch-up is chunked alike on both clocks ---------------------------------------

def test_chunked_draft_catch_ups_schedule_alike_on_both_clocks():
    """A draft model that is the target itself (every greedy draft accepted) on the real engine,
    alpha 1 on the simulator, and ten plain steps before speculation starts: the draft then has
    whole prompts to catch up on, more than the token budget of 16 holds. Both clocks grant the
    catch-ups through the shared DraftProgress in the step's order, so the same requests wait for
    their draft (k > 0, no drafts, a chunk of catch-up) and the same ones draft, step for step."""
    from test_spec_exactness import ScriptedK

    config = EngineConfig(model="tiny", device="cpu", seed=3, block_size=4, num_kv_blocks=96, max_model_len=96,
                          enable_prefix_caching=False, scheduler=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=6),
                          spec=SpecConfig(method="draft", num_speculative_tokens=3, alpha=1.0))
    target = LlamaModel.random(tiny_config(), seed=0)
    real = build_engine(config, model=target, draft=target, policy=ScriptedK([0] * 10 + [3] * 60))
    sim = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"),
                           draft=ModelSpec.of(tiny_config(), "float32"), policy=ScriptedK([0] * 10 + [3] * 60))
    catch_up = {"real": [], "sim": []}
    for name, engine in (("real", real), ("sim", sim)):
        engine.add_observer(lambda record, name=name: catch_up[name].append(
            [(s.request.request_id, s.num_catch_up_tokens) for s in record.batch.scheduled if s.num_catch_up_tokens]))
    real_batches, real_requests = scheduled_batches(real)
    sim_batches, _ = scheduled_batches(sim)
    assert max(sum(n for _, n in step) for step in catch_up["real"]) == 16  # a full budget, never more
    waited = [(rid, own) for b in real_batches for rid, own, drafts, prefill in b if not prefill and not drafts]
    assert waited and sum(r.num_draft_proposed for r in real_requests.values()) > 20
    assert catch_up["real"] == catch_up["sim"]
    assert len(real_batches) == len(sim_batches)
    for i, (a, b) in enumerate(zip(real_batches, sim_batches)):
        assert a == b, f"step {i}: real {a} != simulated {b}"
