"""The drafter fault guard (minispec/speculation/drafter_guard.py): a fault of one request's drafter is that
request's alone (issue 41). Every drafter call the engine makes is guarded, free included, and
nothing leaks; a faulty request's neighbours keep their draft state and keep drafting; after an
observe fault the EAGLE head never drafts from feature rows that were not written."""

import logging

import pytest
import torch

from minispec.core.block_manager import BlockManager
from minispec.base.config import SpecConfig
from minispec.speculation.drafter_guard import DrafterGuard
from minispec.models.llama import LlamaModel
from minispec.core.request import SamplingParams
from minispec.core.drafters import DraftProgress, NgramDrafter
from minispec.core.verify import verify_exact
from minispec.train.distill_eagle import unroll

from conftest import drafter_of, tiny_config, tiny_engine, use_drafter

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

TARGET = LlamaModel.random(tiny_config(), seed=0)
DRAFT = LlamaModel.random(tiny_config(num_layers=1), seed=5)
GREEDY = dict(temperature=0, ignore_eos=True)


def plain_tokens(prompt, max_tokens):
    engine = tiny_engine(TARGET)
    engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))
    return engine.run_until_done()[0].output_token_ids


def run_to_end(engine) -> dict:
    """Step until no request is left (a step that raises fails the test); the final outputs."""
    final = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


class DraftsPerStep:
    """An engine observer: per step, {request id: (drafts proposed, catch-up tokens)} of the
    requests that decoded with k > 0."""

    def __init__(self):
        self.steps: list[dict[str, tuple[int, int]]] = []

    def __call__(self, record):
        self.steps.append({s.request.request_id: (len(s.draft_token_ids), s.num_catch_up_tokens)
                           for s in record.batch.scheduled if s.num_speculative_tokens > 0})


# -- 1. a free that raises stops no step and leaks nothing ---------------------------------------------

def test_a_drafter_free_that_raises_for_one_request_stops_no_step_and_leaks_nothing():
    """Issue 41, item 1: the drafter's free raised for the short request when it finished; the
    engine freed after ``update`` without the guard, so ``step`` raised, both neighbours were left
    unfinished and the short request's draft blocks and progress leaked. Now every request finishes
    with its greedy tokens and the draft pool is empty again."""
    prompts = {"long-a": ([1, 2, 3, 4], 20), "short": ([5, 6, 7], 6), "long-b": ([8, 9, 10, 11, 12], 20)}
    expected = {rid: plain_tokens(p, n) for rid, (p, n) in prompts.items()}
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=3), draft=DRAFT)
    drafter = drafter_of(engine)
    free = drafter.free
    attempts = []

    def failing_free(request_ids):
        attempts.extend(request_ids)
        if "short" in request_ids:
            raise RuntimeError("the drafter cannot free request short")
        free(request_ids)

    drafter.free = failing_free
    for rid, (p, n) in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=n, **GREEDY), request_id=rid)
    final = run_to_end(engine)
    assert "short" in attempts  # the fault did fire
    assert {rid: o.output_token_ids for rid, o in final.items()} == expected
    assert all(o.finish_reason == "length" and o.error is None for o in final.values())
    assert sum(engine.requests[r].num_draft_proposed for r in prompts) > 0
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks  # the draft pool is empty
    assert not drafter.progress.num_cached
    drafter.block_manager.check_invariants()


class PoolDrafter:
    """A minimal drafter with per-request state in a draft pool and a DraftProgress, whose free
    raises whenever request "bad" is among those asked."""

    def __init__(self):
        self.block_manager, self.progress = BlockManager(8, 4), DraftProgress()

    def hold(self, request_id: str) -> None:
        self.block_manager.allocate(request_id, 6)
        self.progress.num_cached[request_id] = 6

    def free(self, request_ids):
        if "bad" in request_ids:
            raise RuntimeError("free broke on request bad")
        self.progress.free(request_ids)
        for rid in request_ids:
            self.block_manager.free(rid)


def test_the_guard_frees_the_neighbours_of_a_failing_free_and_takes_back_what_it_leaves():
    """Freed together with a request whose free raises, the neighbours are still freed; the faulty
    request's draft blocks and progress are taken back by the guard."""
    inner = PoolDrafter()
    for rid in ("a", "bad", "c"):
        inner.hold(rid)
    guard = DrafterGuard(inner, vocab_size=256)
    guard.free(["a", "bad", "c"])
    assert inner.block_manager.num_free_blocks == inner.block_manager.num_blocks
    assert not inner.progress.num_cached


# -- 2. one request's propose fault leaves its neighbours drafting ---------------------------------------

@pytest.mark.parametrize("where", ["propose", "draft-forward"])
def test_a_persistent_propose_fault_of_one_request_leaves_its_neighbours_drafting(where):
    """Issue 41, item 2 (k 3, token budget 16; propose raises whenever the faulty request is in the
    group): the guard freed the whole group's draft state before retrying each request alone, so
    each neighbour's catch-up restarted from position 0 every step and never reached the end under
    the budget: 0 neighbour drafts while the faulty request ran. Now only the faulty request is
    reset: its neighbours draft in every shared step once caught up, run each catch-up token about
    once, and (a fault inside the draft's forward) never count draft K/V that forward did not write:
    a self-draft's every draft is then accepted; the catch-up granted to a forward that raised
    comes back to the retries)."""
    # the faulty request first in line, its catch-up taking the whole budget of the step that fails
    prompts = {"bad": list(range(60, 76)), "a": list(range(1, 15)), "b": list(range(30, 46))}
    max_tokens = 24
    expected = {rid: plain_tokens(p, max_tokens) for rid, p in prompts.items()}
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=3), draft=TARGET,
                         max_num_batched_tokens=16)
    drafter = drafter_of(engine)
    if where == "propose":
        propose = drafter.propose

        def flaky(scheduled):
            if any(s.request.request_id == "bad" for s in scheduled):
                raise RuntimeError("the drafter broke on request bad")
            propose(scheduled)

        drafter.propose = flaky
    else:
        forward = drafter.runner.forward

        def flaky(items, **kw):
            if any(item.request_id == "bad" for item in items):
                raise RuntimeError("the draft's forward broke on request bad")
            return forward(items, **kw)

        drafter.runner.forward = flaky
    log = engine.add_observer(DraftsPerStep())
    for rid, p in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, **GREEDY), request_id=rid)
    final = run_to_end(engine)
    assert {rid: o.output_token_ids for rid, o in final.items()} == expected
    assert all(o.error is None for o in final.values())
    assert engine.requests["bad"].num_draft_proposed == 0
    shared = [step for step in log.steps if "bad" in step and ("a" in step or "b" in step)]
    assert len(shared) >= 6
    for rid in ("a", "b"):
        mine = [step[rid] for step in shared if rid in step]
        assert sum(1 for drafts, _ in mine if drafts) >= len(mine) - 2  # drafting from their second decode on
        r = engine.requests[rid]
        assert sum(step[rid][1] for step in log.steps if rid in step) <= r.num_tokens + r.num_verify_steps
        assert r.num_draft_accepted == r.num_draft_proposed > 0  # a self-draft whose K/V are all written


# -- 3. after an observe fault the EAGLE head never reads a row that was not written ----------------------

class Proposals:
    """An engine observer: per request, (step, its tokens when it proposed, its first draft) of
    each proposal."""

    def __init__(self):
        self.num_steps = 0
        self.by_request: dict[str, list[tuple[int, list[int], int]]] = {}

    def __call__(self, record):
        for s in record.batch.scheduled:
            if s.draft_token_ids:
                self.by_request.setdefault(s.request.request_id, []).append(
                    (self.num_steps, list(s.request.all_token_ids), s.draft_token_ids[0]))
        self.num_steps += 1


def head_ranking(head_model, vocab_map, tokens: list[int]) -> int:
    """The head's own first draft after ``tokens``: its top token at the last position, reading
    the target's true features of every earlier position (the training unroll, which equals
    drafting: tests/test_eagle.py)."""
    ids = torch.tensor([tokens])
    with torch.no_grad():
        features = TARGET.hidden_dense(ids)
        next_ids = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)
        predicted = unroll(head_model, next_ids, features, 1)[0]
        logits = head_model.compute_logits(predicted[0, len(tokens) - 2: len(tokens) - 1])
    return int(vocab_map[int(logits.argmax())])


@pytest.mark.parametrize("fault", [False, True], ids=["no-fault", "observe-fault"])
def test_after_an_observe_fault_the_eagle_head_never_drafts_from_rows_not_written(fault):
    """Issue 41, item 3: three greedy requests on the EAGLE chain k 3; observe raises (in one step)
    for one of them. The guard reset its state, only ``observe`` writes features, and the catch-up
    from position 0 read the rows of that step, never written: 4 of its 15 later proposals were
    not the head's own ranking. Now every proposal of every request is the head's own ranking: the
    request whose observe failed drafts nothing more (its rows are missing), its neighbours keep
    their state and keep drafting."""
    from test_eagle import head

    head_model, _, vocab_map = head()
    prompts = {"a": [1, 2, 3, 4, 5, 6], "bad": [50, 61, 72, 83, 94], "b": list(range(20, 32))}
    expected = {rid: plain_tokens(p, 24) for rid, p in prompts.items()}
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=3),
                         draft=(head_model, None, vocab_map))
    drafter = drafter_of(engine)
    observe, proposals, fault_steps = drafter.observe, Proposals(), []

    def flaky(scheduled, outputs, hidden):
        bad = engine.requests["bad"]
        if fault and not fault_steps and bad.num_output_tokens >= 4:
            fault_steps.append(proposals.num_steps)
        if fault_steps == [proposals.num_steps] and any(s.request is bad for s in scheduled):
            raise RuntimeError("observe broke on request bad")
        observe(scheduled, outputs, hidden)

    drafter.observe = flaky
    engine.add_observer(proposals)
    for rid, p in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=24, **GREEDY), request_id=rid)
    final = run_to_end(engine)
    assert {rid: o.output_token_ids for rid, o in final.items()} == expected
    assert all(o.error is None for o in final.values())
    assert bool(fault_steps) == fault
    mismatched = {rid: [(len(tokens), draft) for _, tokens, draft in made
                        if draft != head_ranking(head_model, vocab_map, tokens)]
                  for rid, made in proposals.by_request.items()}
    assert not any(mismatched.values()), mismatched
    assert all(len(proposals.by_request[rid]) >= 10 for rid in ("a", "b"))
    if fault:  # the neighbours kept drafting after the fault; the request at fault drafted before it
        assert all(any(step > fault_steps[0] for step, _, _ in proposals.by_request[rid]) for rid in ("a", "b"))
        assert any(step < fault_steps[0] for step, _, _ in proposals.by_request["bad"])


# -- a drafter's faults in the engine: one request's fault stays with it (issue 15) ----------------------

class FlakyNgram:
    """An n-gram drafter that raises in propose (or verify) whenever request "bad" is among those asked."""

    def __init__(self, where: str):
        self.inner, self.where = NgramDrafter(1, 3), where

    def propose(self, scheduled):
        if self.where == "propose" and any(s.request.request_id == "bad" for s in scheduled):
            raise RuntimeError("the drafter broke on request bad")
        self.inner.propose(scheduled)

    def verify(self, scheduled, target_logits):
        if self.where == "verify" and scheduled.request.request_id == "bad":
            raise RuntimeError("the verifier broke on request bad")
        return self.inner.verify(scheduled, target_logits)

    def observe(self, scheduled, outputs, hidden):
        pass

    def free(self, request_ids):
        pass


@pytest.mark.parametrize("where", ["propose", "verify"])
def test_a_drafter_fault_for_one_request_makes_it_decode_plainly(where):
    prompts = {"bad": [3, 4, 3, 4, 3, 4], "a": [5, 6, 5, 6, 5, 6], "b": [7, 7, 7], "c": [1, 2, 1, 2]}
    expected = {rid: plain_tokens(p, 14) for rid, p in prompts.items()}
    engine = tiny_engine(TARGET, spec=SpecConfig(method="ngram", num_speculative_tokens=3))
    use_drafter(engine, FlakyNgram(where))
    for rid, p in prompts.items():
        engine.add_request(p, SamplingParams(max_tokens=14, **GREEDY), request_id=rid)
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert {rid: o.output_token_ids for rid, o in outs.items()} == expected
    assert all(o.error is None for o in outs.values())
    assert sum(engine.requests[r].num_draft_proposed for r in "abc") > 0  # the neighbours kept drafting


class ExactVerify:
    """A drafter's verify, observe and free as the simplest drafter has them: exact verification,
    no state. Subclasses propose."""

    def verify(self, scheduled, target_logits):
        return verify_exact(scheduled, target_logits)

    def observe(self, scheduled, outputs, hidden):
        pass

    def free(self, request_ids):
        pass


class BadIds(ExactVerify):
    """A buggy drafter: proposes ids outside the vocabulary (-1 and V) after one good guess."""

    def propose(self, scheduled):
        for s in scheduled:
            s.draft_token_ids = [s.request.all_token_ids[-1], -1, TARGET.cfg.vocab_size][: s.num_speculative_tokens]
            s.draft_probs = None


def test_drafted_ids_outside_the_vocabulary_never_reach_the_target_or_the_output():
    """Issue 15, fault 3 in the engine: an id the target cannot embed ends that request's drafts."""
    engine = tiny_engine(TARGET, spec=SpecConfig(method="ngram", num_speculative_tokens=3))
    use_drafter(engine, BadIds())
    greedy = engine.add_request([7, 7, 7], SamplingParams(max_tokens=12, **GREEDY))
    engine.add_request([1, 2, 3], SamplingParams(max_tokens=12, temperature=1.0, seed=3, ignore_eos=True))
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert outs[greedy].output_token_ids == plain_tokens([7, 7, 7], 12)
    assert all(o.error is None and all(0 <= t < TARGET.cfg.vocab_size for t in o.output_token_ids)
               for o in outs.values())
    r = engine.requests[greedy]
    assert 0 < r.num_draft_proposed <= r.num_verify_steps  # only the one good guess per step was verified


# -- a drafter that never pays is reported (issue 15, fault 7) ---------------------------------------

class AlwaysWrong(ExactVerify):
    """Proposes k copies of a token unrelated to the text: the target (almost) never agrees."""

    def propose(self, scheduled):
        for s in scheduled:
            s.draft_token_ids = [(s.request.all_token_ids[-1] + 101) % 256] * s.num_speculative_tokens
            s.draft_probs = None


def test_speculation_that_never_pays_is_warned_about(caplog):
    params = SamplingParams(max_tokens=80, **GREEDY)
    engine = tiny_engine(TARGET, spec=SpecConfig(method="ngram", num_speculative_tokens=4))
    use_drafter(engine, AlwaysWrong())
    with caplog.at_level(logging.WARNING, logger="minispec"):
        for p in ([1, 2, 3], [4, 5, 6]):
            engine.add_request(p, params)
        engine.run_until_done()
    warnings = [r for r in caplog.records if "acceptance" in r.getMessage()]
    assert len(warnings) == 1, caplog.text  # once, not every step
    assert "acceptance alpha 0.000" in warnings[0].getMessage() and "--spec off" in warnings[0].getMessage()
    caplog.clear()
    engine = tiny_engine(TARGET, spec=SpecConfig(method="draft", num_speculative_tokens=4), draft=TARGET)  # accepts everything: nothing to say
    with caplog.at_level(logging.WARNING, logger="minispec"):
        for p in ([1, 2, 3], [4, 5, 6]):
            engine.add_request(p, params)
        engine.run_until_done()
    assert not [r for r in caplog.records if "acceptance" in r.getMessage()]


# -- issue 26, class 7: a drafter's faults stay contained ------------------------------------------------

@pytest.mark.parametrize("fault", ["surplus", "out-of-vocab", "none", "no-token", "too-many", "wrong-counts"])
def test_a_misbehaving_drafter_costs_no_request_its_tokens(fault, caplog):
    """A drafter proposing more than k (ran past the reserved blocks or over the token budget:
    IndexError, a failed request), or a verify answering no token (read as a prompt chunk: the
    request's counters ran past its K/V), too many tokens or counts that do not match: the executor
    cuts drafts to k and treats a bad verify as a full rejection, so output is plain decoding's."""
    from test_spec_exactness import MisbehavingDrafter, StepAudit

    prompts = [[3, 4, 3, 4, 3, 4], [5, 6, 5, 6, 5], [7, 7, 7]]
    expected = [plain_tokens(p, 20) for p in prompts]
    engine = tiny_engine(TARGET, spec=SpecConfig(method="ngram", num_speculative_tokens=3), max_num_batched_tokens=9)
    drafter = MisbehavingDrafter([fault], seed=1, rate=0.6)
    use_drafter(engine, drafter)
    audit = engine.add_observer(StepAudit(engine))
    with caplog.at_level(logging.WARNING, logger="minispec"):
        ids = [engine.add_request(p, SamplingParams(max_tokens=20, **GREEDY)) for p in prompts]
        outs = {o.request_id: o for o in engine.run_until_done()}
    assert [outs[i].output_token_ids for i in ids] == expected
    assert all(outs[i].error is None for i in ids)
    assert drafter.num_faults > 3 and sum(engine.requests[i].num_draft_accepted for i in ids) > 0
    assert engine.num_free_blocks == engine.block_manager.num_blocks and audit.decode_ks
    if fault == "surplus":
        assert len([r for r in caplog.records if "but k is" in r.getMessage()]) == 1  # logged once
