"""Prefix caching end to end (kv_cache.py, scheduler.py): greedy output with the cache equals output
without it, token for token, for every drafter (none, n-gram, a draft model, the EAGLE head) under
chunked prefill, preemption, eviction and aborts; the EAGLE head drafting after a hit; the counts
behind the hit rate; and the cache's own bookkeeping (chained block hashes, reference counts,
eviction of the least recently freed). Every run checks the BlockManager's invariants after each step and ends with
every block free or free and cached."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.kv import prefix_cache
from minispec.core.block_manager import BlockManager
from minispec.base.config import SpecConfig
from minispec.core.support.metrics import request_metrics
from minispec.tools.summary import StepLog, summarize
from minispec.kv.prefix_cache import PrefixCachingBlockManager
from minispec.core.request import SamplingParams

from conftest import drafter_of, tiny_engine
from test_spec_exactness import EAGLE_HEAD, OTHER_DRAFT, TARGET_MODEL

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

SYSTEM = [(7 * j) % 200 + 20 for j in range(27)]  # a shared "system prompt": 6 full blocks of 4 and 3 tokens
OTHER = [(11 * j) % 200 + 13 for j in range(27)]
PROMPTS = [SYSTEM + [1, 2, 3], SYSTEM + [4, 5], SYSTEM + [6, 7, 8, 9, 10], SYSTEM + [1, 2, 3], SYSTEM[:16],
           OTHER + [3], SYSTEM + [11]]
PARAMS = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)

DRAFTERS = {"off": (None, None), "ngram": (SpecConfig(method="ngram", num_speculative_tokens=3), None),
            "draft": (SpecConfig(method="draft", num_speculative_tokens=3), OTHER_DRAFT),
            "self-draft": (SpecConfig(method="draft", num_speculative_tokens=3), TARGET_MODEL),
            "eagle": (SpecConfig(method="draft", num_speculative_tokens=3), (EAGLE_HEAD, None, None))}
SCHEDULES = {"plain": dict(max_num_seqs=2), "chunked-prefill": dict(max_num_seqs=3, max_num_batched_tokens=8),
             "preemption": dict(max_num_seqs=5, num_kv_blocks=17, max_model_len=64),
             "eviction": dict(max_num_seqs=1, num_kv_blocks=16, max_model_len=64)}


def run(prompts, caching: bool, spec=None, draft=None, aborts=None, params=PARAMS, **sched):
    """Run ``prompts`` to the end; ``aborts``: {request id: (engine, request) -> abort now?}, checked
    after every step. Returns (outputs by request id, engine, the hit of every (re-)admission as
    (request id, preemptions so far, tokens found cached))."""
    engine = tiny_engine(TARGET_MODEL, spec=spec, draft=draft, enable_prefix_caching=caching, **sched)
    ids = [engine.add_request(p, params, request_id=f"r{i}") for i, p in enumerate(prompts)]
    admissions, seen = [], {}

    def record(step):  # before the step is applied: an admitted request's counter is its hit
        for s in step.batch.scheduled:
            r = s.request
            if seen.get(r.request_id) != r.num_preemptions:
                seen[r.request_id] = r.num_preemptions
                admissions.append((r.request_id, r.num_preemptions, r.num_computed_tokens))

    engine.add_observer(record)
    aborts = dict(aborts or {})
    while engine.has_unfinished():
        engine.step()
        engine.block_manager.check_invariants()
        for rid, due in list(aborts.items()):
            if not engine.requests[rid].finished and due(engine.requests[rid]):
                engine.abort(rid)
                del aborts[rid]
                engine.block_manager.check_invariants()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not bm.block_tables
    drafter = drafter_of(engine)
    if drafter is not None and hasattr(drafter, "block_manager"):
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks
        assert not drafter.progress.num_cached
    return {rid: engine.requests[rid].output_token_ids for rid in ids}, engine, admissions


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_output_with_the_prefix_cache_equals_output_without_it(drafter, schedule):
    spec, draft = DRAFTERS[drafter]
    sched = SCHEDULES[schedule]
    plain, _, _ = run(PROMPTS, False, **sched)
    cached, engine, admissions = run(PROMPTS, True, spec, draft, **sched)
    assert cached == plain
    reqs = engine.requests
    assert reqs["r2"].num_cached_tokens == 24  # the 6 full blocks of the system prompt
    assert reqs["r3"].num_cached_tokens >= 24  # the same prompt as r0: everything but the partial block
    assert reqs["r4"].num_cached_tokens in (0, 12)  # 4 blocks all cached: the last is computed again (logits)
    assert reqs["r5"].num_cached_tokens == 0  # another prefix
    if schedule == "preemption":
        assert sum(r.num_preemptions for r in reqs.values()) > 0
        assert any(n > 0 and hit > 0 for _, n, hit in admissions), "no re-admission found its own blocks"
    if schedule == "eviction":  # one request at a time: OTHER's blocks pushed SYSTEM's tail out
        assert reqs["r6"].num_cached_tokens < 24 and reqs["r1"].num_cached_tokens == 24
    if drafter == "self-draft":  # the draft rebuilt its own K/V from position 0: it agrees everywhere
        assert all(r.num_draft_accepted == r.num_draft_proposed for r in reqs.values())
        # under a budget of 8 tokens per step the draft's catch-ups (a prefix hit leaves it 28 tokens
        # behind) share the budget in chunks (DraftProgress.grant): one request may finish first
        drafted = [r for r in reqs.values() if r.num_draft_proposed > 0]
        assert len(drafted) >= len(reqs) - (1 if schedule == "chunked-prefill" else 0)
    if drafter in ("ngram", "draft"):
        assert sum(r.num_draft_proposed for r in reqs.values()) > 0


@pytest.mark.parametrize("shape", [(3, 1, 3), (3, 2, 5)], ids=["chain", "tree"])
def test_the_eagle_head_drafts_after_a_prefix_hit_from_the_cached_features(shape):
    """The target keeps the features the head reads beside its K/V (KVCache.features), so a
    request that starts with a hit catches the head up on the cached positions' features: it
    drafts like the others, each draft (chain or tree) is the head's own greedy ranking of the
    committed tokens, and output stays exact. (Before the store, a request with a hit never
    drafted: the head found no features before the hit.)"""
    from test_spec_exactness import StepAudit, eagle_logits
    from test_tree import TreeAudit

    depth, topk, nodes = shape
    spec = SpecConfig(method="draft", num_speculative_tokens=depth, draft_topk=topk,
                      num_draft_tokens=nodes if topk > 1 else None)
    engine = tiny_engine(TARGET_MODEL, spec=spec, draft=(EAGLE_HEAD, None, None), enable_prefix_caching=True,
                         max_num_seqs=2)
    dense = eagle_logits(EAGLE_HEAD, TARGET_MODEL)
    audit = engine.add_observer(TreeAudit(engine, dense, topk) if topk > 1 else StepAudit(engine, dense))
    ids = [engine.add_request(p, PARAMS, request_id=f"r{i}") for i, p in enumerate(PROMPTS)]
    engine.run_until_done()
    assert [engine.requests[i].output_token_ids for i in ids] == list(run(PROMPTS, False, max_num_seqs=2)[0].values())
    hits = [engine.requests[i] for i in ids if engine.requests[i].num_cached_tokens > 0]
    assert hits and all(r.num_draft_proposed > 0 for r in hits)
    assert audit.num_wrong == 0


@pytest.mark.parametrize("drafter", ["off", "ngram", "draft"])
def test_aborting_requests_that_share_a_prefix_leaves_the_others_exact(drafter):
    """r1 is aborted mid-prefill (holding shared blocks and its own), r2 mid-decode; the shared
    blocks stay with r0 and are found again by r3 and r6; the survivors get their tokens."""
    spec, draft = DRAFTERS[drafter]
    sched = dict(max_num_seqs=3, max_num_batched_tokens=8, memory_follows_use=False)  # r6 finds r0's blocks
    plain, _, _ = run(PROMPTS, False, **sched)
    aborts = {"r1": lambda r: r.status.value == "running" and 0 < r.num_computed_tokens < r.num_prompt_tokens,
              "r2": lambda r: r.num_output_tokens >= 2}
    cached, engine, _ = run(PROMPTS, True, spec, draft, aborts=aborts, **sched)
    reqs = engine.requests
    assert reqs["r1"].status.value == reqs["r2"].status.value == "abort"
    assert reqs["r1"].num_output_tokens == 0 and 2 <= reqs["r2"].num_output_tokens < PARAMS.max_tokens
    assert reqs["r1"].num_cached_tokens == 24  # it was holding shared blocks when it was aborted
    for rid in plain:
        assert cached[rid] == plain[rid][: len(cached[rid])]
        if rid not in ("r1", "r2"):
            assert cached[rid] == plain[rid]
    assert reqs["r3"].num_cached_tokens >= 24 and reqs["r6"].num_cached_tokens == 24


def test_only_computed_blocks_are_found_after_an_abort_mid_prefill():
    """r0 computes 6 tokens of its prompt (the budget) and is aborted: its first block is cached,
    its second (positions 4..7, of which 6 and 7 were never computed) must not be; r1, the same
    prompt, finds 4 tokens and computes the rest, and decodes exactly."""
    sched = dict(max_num_seqs=1, max_num_batched_tokens=6)
    plain, _, _ = run(PROMPTS[:1], False, **sched)
    cached, engine, _ = run([PROMPTS[0], PROMPTS[0]], True, aborts={"r0": lambda r: r.num_computed_tokens > 0},
                            **sched)
    assert engine.requests["r0"].num_computed_tokens == 6 and engine.requests["r0"].status.value == "abort"
    assert engine.requests["r1"].num_cached_tokens == 4
    assert cached["r1"] == plain["r0"]


def test_hit_counts_reach_the_metrics():
    """Per admission: tokens looked up and found (StepStats), the hit rate over a run (summarize),
    prompt tokens found per request (request_metrics); with prefix caching off nothing is looked up."""
    for caching in (False, True):
        engine = tiny_engine(TARGET_MODEL, enable_prefix_caching=caching, max_num_seqs=1, memory_follows_use=False)
        log = engine.add_observer(StepLog())
        ids = [engine.add_request(p, PARAMS) for p in PROMPTS[:4]]
        engine.run_until_done()
        reqs = [engine.requests[i] for i in ids]
        summary = summarize(reqs, 1.0, log.stats)
        queried = sum(s.num_prefix_query_tokens for s in log.stats)
        hits = sum(s.num_prefix_hit_tokens for s in log.stats)
        if not caching:
            assert queried == hits == 0 and summary["prefix_cache_hit_rate"] is None
            assert all(request_metrics(r)["num_cached_tokens"] == 0 for r in reqs)
            continue
        assert [request_metrics(r)["num_cached_tokens"] for r in reqs] == [0, 24, 24, 28]
        assert queried == sum(len(p) for p in PROMPTS[:4]) and hits == 24 + 24 + 28
        assert summary["prefix_cache_hit_rate"] == pytest.approx(hits / queried)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), budget=st.sampled_from([5, 8, 16, 64]), num_blocks=st.sampled_from([12, 20, 200]),
       block_size=st.sampled_from([2, 4]), max_seqs=st.integers(1, 4), drafter=st.sampled_from(["off", "ngram"]))
def test_property_shared_prefixes_budgets_pools_and_aborts(data, budget, num_blocks, block_size, max_seqs, drafter):
    """Random prompts built from two shared prefixes, random budgets, pool sizes and aborts: every
    request that is not aborted gets the tokens it gets without the cache, an aborted one a prefix
    of them, and the pool's invariants hold after every step (``run`` checks them)."""
    stems = [data.draw(st.lists(st.integers(0, 9), min_size=0, max_size=12)) for _ in range(2)]
    prompts = [data.draw(st.sampled_from(stems)) + data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
               for _ in range(data.draw(st.integers(1, 6)))]
    steps = {f"r{i}": data.draw(st.one_of(st.none(), st.integers(1, 12))) for i in range(len(prompts))}
    sched = dict(max_num_batched_tokens=budget, num_kv_blocks=num_blocks, block_size=block_size,
                 max_num_seqs=max_seqs, max_model_len=min(128, num_blocks * block_size))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    plain, _, _ = run(prompts, False, params=params, **sched)
    counter = {}

    def due(at):
        def check(r):  # called once per step while the request is unfinished
            counter[r.request_id] = counter.get(r.request_id, 0) + 1
            return counter[r.request_id] >= at
        return check

    aborts = {rid: due(at) for rid, at in steps.items() if at is not None}
    cached, engine, _ = run(prompts, True, DRAFTERS[drafter][0], params=params, aborts=aborts, **sched)
    for rid, tokens in cached.items():
        if engine.requests[rid].status.value == "abort":
            assert tokens == plain[rid][: len(tokens)]
        else:
            assert tokens == plain[rid]


# -- the prefix cache's own bookkeeping (minispec/kv/prefix_cache.py) ----------------------------------

def computed(bm: BlockManager, rid: str, tokens: list[int]) -> None:
    """Admit ``rid`` with its cached prefix, then "compute" the rest and register its full blocks,
    as the scheduler does."""
    bm.allocate(rid, len(tokens), bm.cached_prefix(tokens, len(tokens) - 1))
    bm.cache_blocks(rid, tokens, len(tokens))
    bm.check_invariants()


def test_a_block_is_named_by_its_tokens_and_all_before_them():
    bm = PrefixCachingBlockManager(16, 4)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    a = bm.block_tables["a"]
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], 8) == a[:2]
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8], 7) == a[:1]  # whole blocks within the limit only
    assert bm.cached_prefix([1, 2, 3, 4, 0, 6, 7, 8], 8) == a[:1]
    assert bm.cached_prefix([0, 2, 3, 4, 5, 6, 7, 8], 8) == []  # block 1's tokens under another parent
    assert prefix_cache.hash_block(prefix_cache.ROOT_HASH, (5, 6, 7, 8)) != \
        prefix_cache.hash_block(prefix_cache.hash_block(prefix_cache.ROOT_HASH, (1, 2, 3, 4)), (5, 6, 7, 8))
    assert BlockManager(16, 4).cached_prefix([1, 2, 3, 4, 5], 4) == []  # prefix caching off finds nothing


def test_shared_blocks_are_reference_counted_and_cached_once_nobody_holds_them():
    bm = PrefixCachingBlockManager(8, 4)
    prefix = [1, 2, 3, 4, 5, 6, 7, 8]
    computed(bm, "a", prefix + [9])
    computed(bm, "b", prefix + [10, 11])
    shared = bm.block_tables["a"][:2]
    assert bm.block_tables["b"][:2] == shared and bm.block_tables["b"][2] != bm.block_tables["a"][2]
    assert [bm.ref_counts[b] for b in shared] == [2, 2] and bm.num_used_blocks == 4
    bm.free("a")
    bm.check_invariants()
    assert [bm.ref_counts[b] for b in shared] == [1, 1] and bm.num_used_blocks == 3  # b still holds them
    bm.free("b")
    bm.check_invariants()
    assert bm.num_free_blocks == 8 and bm.num_cached_blocks == 2  # free, and still found
    assert bm.cached_prefix(prefix + [0], 8) == shared


def test_eviction_takes_the_least_recently_freed_cached_block_and_a_hit_protects_one():
    bm = PrefixCachingBlockManager(4, 2)
    for rid, tokens in (("a", [1, 1]), ("b", [2, 2]), ("c", [3, 3])):  # one full block each
        computed(bm, rid, tokens)
    blocks = {rid: bm.block_tables[rid][0] for rid in "abc"}
    for rid in "abc":
        bm.free(rid)  # a's block is freed first, c's last
    assert bm.num_cached_blocks == 3 and bm.num_free_blocks == 4
    computed(bm, "d", [2, 2, 0])  # a hit: b's block is held again, and the one uncached block
    assert bm.block_tables["d"][0] == blocks["b"] and bm.num_free_blocks == 2
    assert bm.allocate("e", 2)  # no uncached block is left: the least recently freed cached one, a's
    assert bm.cached_prefix([1, 1, 0], 2) == [] and bm.cached_prefix([3, 3, 0], 2) == [blocks["c"]]
    bm.check_invariants()
    assert bm.allocate("f", 2)  # then c's; b's is held
    assert bm.cached_prefix([3, 3, 0], 2) == [] and bm.cached_prefix([2, 2, 0], 2) == [blocks["b"]]
    assert not bm.allocate("g", 2)
    bm.check_invariants()


def test_allocating_with_a_hit_counts_the_revived_blocks_and_a_failure_changes_nothing():
    bm = PrefixCachingBlockManager(4, 2)
    computed(bm, "a", [1, 2, 3, 4, 5])
    bm.free("a")  # 2 cached blocks evictable, 2 free
    hit = bm.cached_prefix([1, 2, 3, 4, 9, 9, 9, 9, 9, 9], 9)
    assert len(hit) == 2
    assert not bm.allocate("b", 10, hit)  # 3 more blocks, but only 2 are free besides the hit
    assert "b" not in bm.block_tables and bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    bm.check_invariants()
    assert bm.allocate("b", 8, hit) and bm.block_tables["b"][:2] == hit and bm.num_free_blocks == 0
    with pytest.raises(ValueError, match="holds blocks already"):
        bm.allocate("b", 8, hit)
    bm.check_invariants()


def test_a_forced_hash_collision_reuses_no_kv(monkeypatch):
    """Every block gets the same hash: a lookup must still compare tokens and parents, so a
    different prefix never gets these K/V, and a request that collides stops registering."""
    monkeypatch.setattr(prefix_cache, "hash_block", lambda parent_hash, token_ids: 7)
    bm = PrefixCachingBlockManager(16, 4)
    computed(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    first = bm.block_tables["a"][0]
    assert bm.num_cached_blocks == 1  # block 1 collided with block 0 and stayed private
    assert bm.cached_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0], 8) == []  # same hash, other tokens
    assert bm.cached_prefix([1, 2, 3, 4, 1, 2, 3, 4, 0], 8) == [first]  # block 1 = block 0's tokens, other parent
    assert bm.cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0], 8) == [first]
    computed(bm, "b", [9, 9, 9, 9, 0])
    assert bm.block_tables["b"][0] != first and bm.num_cached_blocks == 1


def test_reset_forgets_every_cached_block_only_when_none_is_held():
    bm = PrefixCachingBlockManager(8, 4)
    computed(bm, "a", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="held by requests"):
        bm.reset_prefix_cache()
    bm.free("a")
    bm.reset_prefix_cache()
    bm.check_invariants()
    assert bm.num_cached_blocks == 0 and bm.cached_prefix([1, 2, 3, 4, 5], 4) == [] and bm.num_free_blocks == 8


def test_a_pool_whose_memory_follows_use_evicts_before_touching_a_new_block():
    """With prefix caching, freed cached blocks stay; a pool whose memory is committed on first use
    (a CPU's) evicts them before it takes a block never used, so it touches only as many blocks as
    were ever held at once. A GPU-style pool takes the never-used blocks first and caches more."""
    touched = {}
    for follows in (False, True):
        bm = PrefixCachingBlockManager(64, 4, memory_follows_use=follows)
        for i in range(10):  # ten requests one after another, 3 blocks each, no shared prefix
            tokens = [100 * i + j for j in range(12)]
            assert bm.allocate(f"r{i}", 12)
            bm.cache_blocks(f"r{i}", tokens, 12)
            bm.free(f"r{i}")
            bm.check_invariants()
        touched[follows] = bm.num_blocks_touched
        cached_now = bm.num_cached_blocks
    assert touched[True] == 3 and touched[False] == 30
    assert cached_now == 3  # the cache lives in the memory already used: the last request's blocks
