"""Speculation inside the continuous batch: edge cases, policies in the engine, metrics, seeded
sampling beside neighbours and aborts inside a step. A drafter's faults: tests/test_drafter_guard.py;
the policies alone: tests/test_policy.py."""

import pytest
import torch

from minispec.base.config import SpecConfig
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.tools.summary import StepLog

from conftest import tiny_config, tiny_engine, use_drafter

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

TARGET = LlamaModel.random(tiny_config(), seed=0)
SELF = SpecConfig(method="draft", num_speculative_tokens=4)
GREEDY = dict(temperature=0, ignore_eos=True)


def plain_tokens(prompt, **params):
    engine = tiny_engine(TARGET)
    engine.add_request(prompt, SamplingParams(**params))
    return engine.run_until_done()[0].output_token_ids


class ProposeCounter:
    """An engine observer counting the steps in which the executor asked the drafter to propose
    (a step with any request given k > 0) and the draft positions proposed."""

    def __init__(self):
        self.calls, self.positions = 0, 0

    def __call__(self, record):
        speculating = [s for s in record.batch.scheduled if s.num_speculative_tokens > 0]
        self.calls += bool(speculating)
        self.positions += sum(len(s.draft_token_ids) for s in speculating)


def test_eos_inside_an_accepted_run_ends_the_request_there():
    prompt = [5, 6, 7]
    free_run = plain_tokens(prompt, max_tokens=20, **GREEDY)
    eos = free_run[6]
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET)
    engine.stops.eos_token_ids = frozenset({eos})
    engine.add_request(prompt, SamplingParams(max_tokens=20, temperature=0))
    out = engine.run_until_done()[0]
    assert out.output_token_ids == free_run[: free_run.index(eos) + 1]
    assert out.finish_reason == "stop"


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 6, 7])
def test_max_tokens_is_never_exceeded(max_tokens):
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET)
    log = engine.add_observer(StepLog())
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=max_tokens, **GREEDY))
    out = engine.run_until_done()[0]
    assert len(out.output_token_ids) == max_tokens
    if max_tokens == 1:
        assert engine.requests[rid].num_draft_proposed == 0 and all(s.num_draft_proposed == 0 for s in log.stats)


def test_k_shrinks_near_the_draft_models_maximum_length():
    short_draft = LlamaModel.random(tiny_config(max_position_embeddings=30), seed=0)
    short_draft.load_state_dict(TARGET.state_dict())
    engine = tiny_engine(TARGET, spec=SELF, draft=short_draft, max_model_len=60)
    prompt = list(range(20))
    engine.add_request(prompt, SamplingParams(max_tokens=35, **GREEDY))
    out = engine.run_until_done()[0]
    assert out.output_token_ids == plain_tokens(prompt, max_tokens=35, **GREEDY)
    r = engine.requests[out.request_id]
    assert r.num_draft_proposed > 0 and r.num_tokens == 55  # decoding went on plainly past the draft's limit


def test_k_shrinks_near_the_targets_maximum_length():
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET, max_model_len=24)
    engine.add_request(list(range(15)), SamplingParams(max_tokens=50, **GREEDY))
    out = engine.run_until_done()[0]
    assert len(out.output_token_ids) == 24 - 15 and out.finish_reason == "length"


def test_a_prompt_chunk_of_k_plus_1_tokens_is_still_a_prefill():
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET, max_num_batched_tokens=5)
    log = engine.add_observer(StepLog())
    counting = engine.add_observer(ProposeCounter())
    engine.add_request(list(range(10)), SamplingParams(max_tokens=3, **GREEDY))  # two chunks of k + 1 = 5
    engine.step()
    engine.step()
    assert [s.num_prefill_tokens for s in log.stats] == [5, 5]
    assert all(s.num_draft_proposed == 0 for s in log.stats) and counting.calls == 0


def test_preemption_during_speculation_leaves_no_stale_draft_state():
    prompts = [list(range(i, i + 12)) for i in range(5)]
    params = SamplingParams(max_tokens=24, **GREEDY)
    expected = [plain_tokens(p, max_tokens=24, **GREEDY) for p in prompts]
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET, num_kv_blocks=14, max_model_len=40)
    drafter = engine.drafter.inner
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        engine.step()
        for r in engine.requests.values():
            if r.status.value == "waiting":  # preempted (or never started): no draft state survives
                assert r.request_id not in drafter.progress.num_cached
                assert r.request_id not in drafter.block_manager.block_tables
    assert sum(engine.requests[i].num_preemptions for i in ids) > 0
    assert [engine.requests[i].output_token_ids for i in ids] == expected
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


def test_abort_mid_stream_frees_target_and_draft_blocks():
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET)
    drafter = engine.drafter.inner
    rid = engine.add_request(list(range(9)), SamplingParams(max_tokens=40, **GREEDY))
    for _ in range(3):
        engine.step()
    assert drafter.block_manager.num_used_blocks > 0 and engine.block_manager.num_used_blocks > 0
    engine.abort(rid)
    assert drafter.block_manager.num_used_blocks == 0 and engine.block_manager.num_used_blocks == 0
    assert not drafter.progress.num_cached


def test_a_drafter_without_proposal_decodes_plainly():
    engine = tiny_engine(TARGET, spec=SpecConfig(method="ngram", num_speculative_tokens=4, ngram_min=3))
    log = engine.add_observer(StepLog())
    prompt = [11, 12, 13, 14]  # no repeated 3-gram: nothing to look up
    engine.add_request(prompt, SamplingParams(max_tokens=3, **GREEDY))
    out = engine.run_until_done()[0]
    assert out.output_token_ids == plain_tokens(prompt, max_tokens=3, **GREEDY)
    assert all(s.num_draft_proposed == 0 for s in log.stats)


def test_ngram_lookup_proposes_the_continuation():
    from minispec.core.drafters import NgramDrafter

    d = NgramDrafter(1, 3)
    assert d.lookup([1, 2, 3, 4, 9, 1, 2, 3], 3) == [4, 9, 1]
    assert d.lookup([1, 2, 3, 4, 9, 1, 2, 3], 1) == [4]
    assert d.lookup([5, 6, 7], 2) == []
    assert d.lookup([7, 8, 7, 9, 7], 2) == [9, 7]  # the latest match wins


def test_vocabulary_padding_and_subset_give_zero_probability_outside():
    from minispec.models.draft import to_target_vocab

    assert to_target_vocab(torch.zeros(1, 8), 6).shape == (1, 6)
    assert torch.isinf(to_target_vocab(torch.zeros(1, 8), 10)[0, 8:]).all()
    row = to_target_vocab(torch.tensor([[1.0, 2.0, 3.0]]), 10, torch.tensor([9, 0, 3]))[0]
    assert row[9] == 1 and row[0] == 2 and row[3] == 3 and torch.isinf(row[[1, 2, 4, 5, 6, 7, 8]]).all()


def test_different_tokenizer_is_refused(bundled):
    from minispec.build.speculation import check_vocab_compatible

    class Other:
        def get_vocab(self):
            vocab = dict(bundled[1].get_vocab())
            a, b = "hello", "world"
            if a in vocab and b in vocab:
                vocab[a], vocab[b] = vocab[b], vocab[a]
            return vocab

    with pytest.raises(ValueError, match="tokenizer differs"):
        check_vocab_compatible(bundled[1], Other())
    check_vocab_compatible(bundled[1], bundled[1])


def test_synthetic_drafter_pins_acceptance_and_marks_output():
    engine = tiny_engine(TARGET, spec=SpecConfig(method="synthetic", num_speculative_tokens=4, alpha=0.7),
                         num_kv_blocks=200, max_model_len=400)
    ids = [engine.add_request([1, 2, 3], SamplingParams(max_tokens=300, **GREEDY)) for _ in range(4)]
    outs = engine.run_until_done()
    proposed = sum(engine.requests[i].num_draft_proposed for i in ids)
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    verify_steps = sum(engine.requests[i].num_verify_steps for i in ids)
    emitted = sum(engine.requests[i].num_verify_emitted for i in ids)
    alpha, k = 0.7, 4
    assert all(o.synthetic for o in outs)
    # E[accepted per step] = sum_{i=1..k} alpha^i; over ~300 verify steps the standard error is < 0.1
    assert abs(accepted / verify_steps - sum(alpha ** i for i in range(1, k + 1))) < 0.3
    assert abs(emitted / verify_steps - (1 - alpha ** (k + 1)) / (1 - alpha)) < 0.3
    assert k * (verify_steps - 4 * 3) <= proposed <= k * verify_steps  # k shrinks only near max_tokens


# -- policies in the engine (the policies alone: tests/test_policy.py) -----------------------------

def test_never_policy_costs_nothing():
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=4, policy="never"),
                         draft=TARGET)
    log = engine.add_observer(StepLog())
    counting = engine.add_observer(ProposeCounter())
    for i in range(3):
        engine.add_request([1, 2, 3 + i], SamplingParams(max_tokens=10, **GREEDY))
    engine.run_until_done()
    assert counting.calls == 0 and all(s.num_draft_proposed == 0 for s in log.stats)
    # and no reserved slots: every block table covers exactly the tokens it needs
    assert log.stats and all(s.num_tokens == s.num_prefill_tokens + s.num_decode_tokens for s in log.stats)


def test_per_request_override_opts_in_and_out():
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=4, policy="never"),
                         draft=TARGET)
    opt_in = engine.add_request([1, 2, 3], SamplingParams(max_tokens=10, num_speculative_tokens=2, **GREEDY))
    default = engine.add_request([1, 2, 4], SamplingParams(max_tokens=10, **GREEDY))
    engine.run_until_done()
    assert engine.requests[opt_in].num_draft_proposed > 0 and engine.requests[default].num_draft_proposed == 0
    assert max(engine.requests[opt_in].proposed_by_position and [len(engine.requests[opt_in].proposed_by_position)]) == 2
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=4), draft=TARGET)
    opt_out = engine.add_request([1, 2, 3], SamplingParams(max_tokens=10, num_speculative_tokens=0, **GREEDY))
    engine.run_until_done()
    assert engine.requests[opt_out].num_draft_proposed == 0


def test_lane_policy_in_the_engine_only_speculates_interactive():
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=3, policy="lane"),
                         draft=TARGET)
    inter = engine.add_request([1, 2, 3], SamplingParams(max_tokens=12, **GREEDY), lane="interactive")
    bulk = engine.add_request([1, 2, 4], SamplingParams(max_tokens=12, **GREEDY), lane="bulk")
    engine.run_until_done()
    assert engine.requests[inter].num_draft_proposed > 0 and engine.requests[bulk].num_draft_proposed == 0


def test_speculation_metrics_per_request_and_step():
    from minispec.core.support.metrics import request_metrics
    from minispec.tools.summary import summarize

    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET)
    log = engine.add_observer(StepLog())
    rid = engine.add_request([1, 2, 3], SamplingParams(max_tokens=21, **GREEDY))
    engine.run_until_done()
    m = request_metrics(engine.requests[rid])
    assert m["acceptance_rate"] == 1.0 and m["mean_accepted_length"] == 5.0
    assert m["acceptance_by_position"] == [1.0, 1.0, 1.0, 1.0]
    verify_steps = [s for s in log.stats if s.num_draft_proposed]
    assert verify_steps and all(s.num_draft_proposed == 4 and s.draft_time_s > 0 for s in verify_steps)
    summary = summarize(list(engine.requests.values()), 1.0, log.stats)
    assert summary["acceptance_rate"] == 1.0 and summary["num_draft_proposed"] == 16


# -- one request's fault stays with that request (issue 15, fault 2) --------------------------------

def test_a_draft_with_a_smaller_vocabulary_stops_drafting_where_it_cannot_embed_a_token():
    """The draft passes the build-time check (padded vocabularies are allowed) but cannot embed ids
    >= 200: a request that emits one decodes on without drafts, exactly; its neighbours keep drafting."""
    small = LlamaModel.random(tiny_config(vocab_size=200), seed=0)
    prompts = [[10, 20, 30], [1, 2, 3], [5, 6, 7], [7, 7, 7]]
    expected = [plain_tokens(p, max_tokens=16, **GREEDY) for p in prompts]
    assert any(max(e) >= 200 for e in expected) and any(max(e) < 200 for e in expected)
    engine = tiny_engine(TARGET, spec=SELF, draft=small)
    ids = [engine.add_request(p, SamplingParams(max_tokens=16, **GREEDY)) for p in prompts]
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert [outs[i].output_token_ids for i in ids] == expected
    assert all(outs[i].error is None for i in ids)
    assert sum(engine.requests[i].num_draft_proposed for i in ids) > 0
    drafter = engine.drafter.inner
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


# -- seeded sampling does not depend on the neighbours (issue 15, fault 5) -----------------------------

def test_seeded_sampling_with_speculation_is_the_same_alone_and_beside_seven_others():
    """For a fixed k (pinned per request, room in the KV pool and the budget), a seeded request draws
    the same text whatever rides the batch with it: greedy and sampled neighbours, other k, prompt
    chunks, neighbours that finish early."""
    from test_spec_exactness import NOISY_DRAFT

    params = SamplingParams(max_tokens=30, temperature=0.8, seed=123, ignore_eos=True, num_speculative_tokens=4)
    prompt = [10, 20, 30]

    def run(num_others: int):
        engine = tiny_engine(TARGET, spec=SELF, draft=NOISY_DRAFT, num_kv_blocks=400, max_num_batched_tokens=64)
        rid = engine.add_request(prompt, params)  # first in line: the budget never cuts its k
        for i in range(num_others):
            engine.add_request([i + 1] * (3 + 9 * i), SamplingParams(
                max_tokens=5 + 4 * i, temperature=[0, 1.0, 0.5][i % 3], ignore_eos=True,
                num_speculative_tokens=[0, 2, None][i % 3]))
        engine.run_until_done()
        return engine.requests[rid]

    alone, crowded = run(0), run(7)
    assert crowded.output_token_ids == alone.output_token_ids
    assert crowded.num_draft_proposed == alone.num_draft_proposed > 0


class VerifySteps:
    """An engine observer: for one request, (output position, k, accepted, tokens) of each step
    that gave it tokens."""

    def __init__(self, request_id: str):
        self.request_id, self.steps = request_id, []

    def __call__(self, record):
        for s, out in zip(record.batch.scheduled, record.result.outputs):
            if s.request.request_id == self.request_id and out.token_ids:
                self.steps.append((s.request.num_output_tokens, s.num_speculative_tokens, out.num_draft_accepted,
                                   out.token_ids))


def test_seeded_sampling_keeps_its_tokens_where_neighbours_lower_its_k():
    """The issue's case: neighbours that decode first leave the seeded request a smaller k for a
    while (the token budget cuts it to 2, then 3). A step with a lower k draws the same drafts, accept
    tests and residual at each position as the step of k 4 would, so the text stays the one it has
    alone up to the first lowered step that accepts all its drafts (there the bonus token takes a
    position the longer block tests a draft at). With one generator drawn in order, the first
    lowered step shifted every later number: 5 of these 10 seeds then differed."""
    draft = LlamaModel.random(tiny_config(num_layers=1), seed=5)
    k, max_tokens = 4, 40

    def run(seed: int, num_others: int):
        engine = tiny_engine(TARGET, spec=SELF, draft=draft, num_kv_blocks=400, max_num_batched_tokens=8)
        for i in range(num_others):  # greedy, no drafts, arrived first: their decodes take the budget first
            engine.add_request([i + 1] * 3, SamplingParams(max_tokens=6 + 6 * i, num_speculative_tokens=0, **GREEDY))
        rid = engine.add_request([10, 20, 30], SamplingParams(max_tokens=max_tokens, temperature=0.8, seed=seed,
                                                              ignore_eos=True, num_speculative_tokens=k))
        steps = engine.add_observer(VerifySteps(rid))
        engine.run_until_done()
        return engine.requests[rid].output_token_ids, steps.steps

    num_compared = 0
    for seed in range(10):
        alone, _ = run(seed, 0)
        crowded, steps = run(seed, 5)
        end = len(crowded)
        for position, num_drafts, num_accepted, _ in steps[1:]:  # steps[0] is the prefill
            if num_drafts < k and position + k < max_tokens:  # lowered by the neighbours, not by max_tokens
                if num_accepted == num_drafts:
                    end = position
                    break
                num_compared += 1
        assert crowded[:end] == alone[:end], seed
    assert num_compared >= 10  # lowered steps that ended in a rejection, each a chance to differ


# -- issue 26, class 6: an abort asked for during a step takes effect at its end -----------------------

class AbortingDrafter:
    """Wraps a drafter; its first propose aborts request ``victim`` through the engine, after the
    inner drafter allocated the draft blocks of the requests asked."""

    def __init__(self, inner, engine, victim: str):
        self.inner, self.engine, self.victim, self.answer = inner, engine, victim, None

    @property
    def block_manager(self):
        return self.inner.block_manager

    def propose(self, scheduled):
        self.inner.propose(scheduled)
        if self.answer is None:
            self.answer = self.engine.abort(self.victim)

    def verify(self, scheduled, target_logits):
        return self.inner.verify(scheduled, target_logits)

    def observe(self, scheduled, outputs, hidden):
        self.inner.observe(scheduled, outputs, hidden)

    def free(self, request_ids):
        self.inner.free(request_ids)


@pytest.mark.parametrize("where", ["propose", "observer"])
@pytest.mark.parametrize("victim", ["a", "waiting"], ids=["in-the-step", "waiting"])
def test_an_abort_from_inside_a_step_takes_effect_at_its_end(where, victim):
    """Issue 26, class 6: ``engine.abort`` from a drafter's propose made ``step`` raise "unknown
    request id" (the forward met a request whose blocks were gone) and leaked its draft blocks; from
    an observer it returned tokens the request never kept. Now the abort waits for the step's end:
    the step returns the victim's final, aborted output, its stream adds up, its neighbours keep
    their greedy tokens, and every target and draft block comes back."""
    prompts = {"a": [5, 6, 7, 8], "b": [1, 2, 3], "waiting": [9, 9, 9]}
    expected = {rid: plain_tokens(p, max_tokens=16, **GREEDY) for rid, p in prompts.items()}
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET, max_num_seqs=2)
    drafter = engine.drafter.inner
    answers = []
    if where == "propose":
        use_drafter(engine, AbortingDrafter(drafter, engine, victim))
    else:
        engine.add_observer(lambda record: answers.append(engine.abort(victim)) if not answers and any(
            s.num_speculative_tokens for s in record.batch.scheduled) else None)
    for rid, p in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=16, **GREEDY), request_id=rid)
    streams, final = {}, {}
    while engine.has_unfinished():
        for out in engine.step():
            streams[out.request_id] = streams.get(out.request_id, []) + out.new_token_ids
            if out.finished:
                final[out.request_id] = out
        engine.block_manager.check_invariants()
        drafter.block_manager.check_invariants()
    assert final[victim].finish_reason == "abort" and final[victim].error is None
    for rid, out in final.items():
        assert streams.get(rid, []) == out.output_token_ids  # the stream adds up to what was kept
        assert out.output_token_ids == expected[rid][: len(out.output_token_ids)]
        if rid != victim:
            assert out.finish_reason == "length" and out.output_token_ids == expected[rid]
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks and not drafter.progress.num_cached
    answer = engine.drafter.inner.answer if where == "propose" else answers[0]
    assert answer.request_id == victim and not answer.finished  # the abort waits for the step's end


def test_an_abort_during_a_step_of_an_unknown_or_twice_aborted_id_is_refused():
    engine = tiny_engine(TARGET, spec=SELF, draft=TARGET)
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=8, **GREEDY), request_id="a")
    errors = []

    def observer(record):
        for rid in ("nope", "a", "a"):
            try:
                engine.abort(rid)
            except ValueError as exc:
                errors.append(str(exc))

    engine.add_observer(observer)
    outs = engine.step()
    assert [o.finish_reason for o in outs] == ["abort"]
    assert len(errors) == 2 and all("unknown request id" in e for e in errors)
    assert not engine.has_unfinished() and engine.num_free_blocks == engine.block_manager.num_blocks
