"""Scheduler invariants under generated workloads, with a fake executor (no model) for speed."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.base.config import EngineConfig, SchedulerConfig
from minispec.core.engine import Engine
from minispec.core.block_manager import BlockManager
from minispec.core.batch import EmittedTokens, StepResult
from minispec.core.request import Request, SamplingParams
from minispec.core.scheduler import Scheduler
from minispec.speculation.policy import AlwaysPolicy
from minispec.core.support.stops import StopChecker


class FakeExecutor:
    """Emits token 7 for every completed prefill/decode; verifies accept a random prefix."""

    vocab_size = 100

    def __init__(self, seed=0):
        self.rng = random.Random(seed)
        self.batches = []

    def execute(self, batch):
        self.batches.append(batch)
        outs = []
        for s in batch.scheduled:
            s.draft_token_ids = [7] * s.num_speculative_tokens
            if not s.samples:
                outs.append(EmittedTokens([]))
            else:
                a = self.rng.randint(0, len(s.draft_token_ids))
                outs.append(EmittedTokens([7] * (a + 1), len(s.draft_token_ids), a))
        return StepResult(outs)

    def free(self, ids):
        pass


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 0.001
        return self.t


def fake_engine(budget, max_seqs, num_blocks, block_size, max_len, k=0, chunked=True):
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, enable_chunked_prefill=chunked)
    bm = BlockManager(num_blocks, block_size)
    sched = Scheduler(cfg, bm, max_len, policy=AlwaysPolicy(k) if k else None)
    return Engine(EngineConfig(model="fake"), sched, FakeExecutor(), clock=FakeClock(), max_model_len=max_len)


workloads = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 30), st.sampled_from(["interactive", "bulk"]),
                               st.integers(0, 5)), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(workload=workloads, budget=st.integers(1, 64), max_seqs=st.integers(1, 8), block_size=st.sampled_from([1, 4, 16]),
       extra_blocks=st.integers(0, 40), k=st.integers(0, 6))
def test_invariants_hold_and_every_request_finishes(workload, budget, max_seqs, block_size, extra_blocks, k):
    max_len = 96
    num_blocks = -(-max_len // block_size) + extra_blocks
    engine = fake_engine(budget, max_seqs, num_blocks, block_size, max_len, k)
    pending = sorted(workload, key=lambda w: w[3])
    ids, step_no = [], 0
    while pending or engine.has_unfinished():
        while pending and pending[0][3] <= step_no:
            plen, max_tokens, lane, _ = pending.pop(0)
            ids.append(engine.add_request([3] * plen, SamplingParams(max_tokens=max_tokens, temperature=0),
                                          lane=lane))
        engine.step()
        step_no += 1
        bm = engine.block_manager
        bm.check_invariants()
        assert len(engine.scheduler.running) <= max_seqs
        for r in engine.scheduler.running:  # every running request's blocks cover what it computed
            assert len(bm.block_tables.get(r.request_id, [])) * block_size >= r.num_computed_tokens
        assert step_no < 20000, "the scheduler stopped making progress"
    for batch in engine.executor.batches:
        assert batch.num_tokens <= budget
        assert len({s.request.request_id for s in batch.scheduled}) == len(batch.scheduled)
    for rid in ids:
        r = engine.requests[rid]
        assert r.finished and r.status.value == "length"
        assert r.num_output_tokens == min(r.sampling_params.max_tokens, max_len - r.num_prompt_tokens)
    assert engine.block_manager.num_free_blocks == num_blocks


def test_without_chunking_a_prompt_is_prefilled_in_one_step():
    engine = fake_engine(96, 4, 64, 4, 96, chunked=False)
    engine.add_request([1] * 50, SamplingParams(max_tokens=2))
    engine.add_request([1] * 60, SamplingParams(max_tokens=2))
    engine.step()
    first = engine.executor.batches[0]
    assert [s.num_own_tokens for s in first.scheduled] == [50]  # the second does not fit: it waits whole
    engine.run_until_done()
    assert all(s.num_own_tokens in (1, 50, 60) for b in engine.executor.batches for s in b.scheduled)


def test_preempted_request_requeues_first_in_its_lane():
    engine = fake_engine(64, 8, 6, 4, 24)
    a = engine.add_request([1] * 10, SamplingParams(max_tokens=12))
    b = engine.add_request([1] * 10, SamplingParams(max_tokens=12))
    engine.run_until_done()
    ra, rb = engine.requests[a], engine.requests[b]
    assert rb.num_preemptions >= 1 and ra.num_preemptions == 0  # the later arrival is the victim
    assert ra.num_output_tokens == rb.num_output_tokens == 12


# -- issue 32, class 4: an empty output of a step that samples is refused, not read as a chunk ------

def test_update_refuses_a_decode_that_kept_no_token_and_changes_nothing():
    """A hand-written executor answers a decode (and, on another request, a prompt's last chunk)
    with no token. ``update`` used to read that as a prompt chunk: it moved num_computed_tokens
    past the request's last token, so its next step had no token of its own. Now it raises a
    ValueError naming the request and applies nothing of the step, its neighbour's token included."""
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64), BlockManager(16, 4), 64)
    stops = StopChecker(64)
    for rid, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6, 7])):
        sched.add(Request(rid, prompt, SamplingParams(max_tokens=8), arrival_time_s=0.0))
    first = sched.schedule()  # both prefills, each to its prompt's end
    kept = [stops.keep(s, EmittedTokens([9])) for s in first.scheduled]
    sched.update(first, kept, now_s=1.0)
    decode = sched.schedule()
    assert [(s.request.request_id, s.num_own_tokens, s.is_prefill) for s in decode.scheduled] == [("a", 1, False),
                                                                                                  ("b", 1, False)]
    before = [(r.num_computed_tokens, list(r.output_token_ids), list(r.token_times_s)) for r in sched.running]
    kept = [stops.keep(s, out) for s, out in zip(decode.scheduled, [EmittedTokens([9]), EmittedTokens([])])]
    with pytest.raises(ValueError, match=r"request 'b' ran a decode but kept no token"):
        sched.update(decode, kept, now_s=2.0)
    assert [(r.num_computed_tokens, list(r.output_token_ids), list(r.token_times_s)) for r in sched.running] == before
    assert all(r.num_computed_tokens == r.num_tokens - 1 for r in sched.running)  # each still has its own token

    sched.add(Request("c", [1] * 5, SamplingParams(max_tokens=8), arrival_time_s=0.0))
    batch = sched.schedule()
    last_chunk = next(s for s in batch.scheduled if s.request.request_id == "c")
    outs = [EmittedTokens([]) if s is last_chunk else EmittedTokens([9]) for s in batch.scheduled]
    with pytest.raises(ValueError, match=r"request 'c' ran a prompt's last chunk but kept no token"):
        sched.update(batch, [stops.keep(s, o) for s, o in zip(batch.scheduled, outs)], now_s=3.0)
    assert last_chunk.request.num_computed_tokens == 0
