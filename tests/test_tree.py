"""Draft trees: verification keeps the target's law (greedy and sampled), and a chain is a tree.

The sampled tests are Pearson chi-square tests with a false-failure probability of 1e-4 each
(P_FAIL), on the joint law of the first two tokens: a verify emits the second token only when the
first was an accepted node, so when it stopped after one token the test draws the second from
the target itself, as the next step would. The seeds are fixed, so a run is reproducible.
"""

import pytest
import torch

from minispec.core.sampling import SeededDraws
from minispec.speculation.tree_verify import verify_tree_greedy, verify_tree_sampled
from minispec.core.verify import verify_greedy
from minispec.base.tree_shape import is_chain, tree_children

from test_spec_exactness import P_FAIL, chi2_pvalue

# results depend on the kernels the engine runs: the fast-kernel pass of `make test` runs these (-m kernels)
pytestmark = pytest.mark.kernels

V = 6
FIRST = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00])     # the target after the request's last token
NEXT = torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(1)), dim=-1)  # row a: after token a
DRAFT = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.10, 0.20])     # the draft's law at the root
DRAFT_NEXT = torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(2)), dim=-1)


def target_rows(tokens: list[int]) -> torch.Tensor:
    """[N + 1, V]: the target after the last token, then after each node (its law depends on the
    node's own token only, so every path's target is well defined)."""
    return torch.stack([FIRST] + [NEXT[t] for t in tokens])


def joint_counts(propose, trials: int) -> torch.Tensor:
    """Counts [V, V] of the first two tokens over ``trials`` verifies of trees from ``propose(g)``
    (which returns tokens, parents, draft_probs or None)."""
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(V, V)
    for trial in range(trials):
        tokens, parents, probs = propose(g)
        emitted, path = verify_tree_sampled(tokens, parents, probs, target_rows(tokens), SeededDraws(trial))
        assert emitted[:-1] == [tokens[n] for n in path]
        assert all(parents[b] == a for a, b in zip([-1] + path, path))
        second = emitted[1] if len(emitted) > 1 else int(torch.multinomial(NEXT[emitted[0]], 1, generator=g))
        counts[emitted[0], second] += 1
    return counts


def expected_joint(trials: int) -> torch.Tensor:
    return trials * FIRST[:, None] * NEXT


def without_replacement(probs: torch.Tensor, n: int, g) -> list[int]:
    out, p = [], probs.clone()
    for _ in range(n):
        out.append(int(torch.multinomial(p, 1, generator=g)))
        p[out[-1]] = 0.0
    return out


def sampled_tree(g):
    """Three roots drawn without replacement from DRAFT; the first root gets two children drawn
    without replacement from its own draft law."""
    roots = without_replacement(DRAFT, 3, g)
    kids = without_replacement(DRAFT_NEXT[roots[0]], 2, g)
    probs = torch.stack([DRAFT] * 3 + [DRAFT_NEXT[roots[0]]] * 2)
    return roots + kids, [-1, -1, -1, 0, 0], probs


def with_replacement_tree(g):
    """Four roots drawn with replacement (duplicates happen: DRAFT puts 0.4 on one token), each
    duplicate a repeated proposal the rule must not count twice."""
    roots = torch.multinomial(DRAFT, 4, replacement=True, generator=g).tolist()
    kid = int(torch.multinomial(DRAFT_NEXT[roots[0]], 1, generator=g))
    return roots + [kid], [-1, -1, -1, -1, 0], torch.stack([DRAFT] * 4 + [DRAFT_NEXT[roots[0]]])


def deterministic_tree(g):
    """A deterministic drafter's tree: a duplicate root (token 1 twice), a root the target gives
    no mass (token 5), and a two-level branch under token 3."""
    return [1, 1, 5, 3, 0, 2, 4], [-1, -1, -1, -1, 3, 3, 4], None


@pytest.mark.parametrize("propose", [sampled_tree, with_replacement_tree, deterministic_tree])
def test_tree_rejection_sampling_keeps_the_target_law(propose):
    trials = 20000
    counts = joint_counts(propose, trials)
    assert chi2_pvalue(counts.flatten(), expected_joint(trials).flatten()) > P_FAIL


def test_the_chi_square_catches_a_rule_that_ignores_earlier_rejections(monkeypatch):
    """The same test fails a plausible bug: testing every child against the untouched target row
    (no residual), which over-weights tokens that several children share mass with."""
    import minispec.speculation.tree_verify as verify

    def no_residual(tokens, parents, probs, target, draws):
        draws_ = draws
        children = tree_children(parents)
        node, path = -1, []
        while True:
            row = target[node + 1].double()
            nxt = None
            for j, c in enumerate(children.get(node, ())):
                q = 1.0 if probs is None else float(probs[c][tokens[c]])
                if draws_.uniform(len(path), branch=j) <= float(row[tokens[c]]) / q:
                    nxt = c
                    break
            if nxt is None:
                return [tokens[n] for n in path] + [draws_.sample(row, len(path))], path
            path.append(nxt)
            node = nxt

    monkeypatch.setattr(verify, "verify_tree_sampled", no_residual)
    counts = torch.zeros(V, V)
    g = torch.Generator().manual_seed(3)
    trials = 20000
    for trial in range(trials):
        tokens, parents, probs = sampled_tree(g)
        emitted, _ = verify.verify_tree_sampled(tokens, parents, probs, target_rows(tokens), SeededDraws(trial))
        second = emitted[1] if len(emitted) > 1 else int(torch.multinomial(NEXT[emitted[0]], 1, generator=g))
        counts[emitted[0], second] += 1
    assert chi2_pvalue(counts.flatten(), expected_joint(trials).flatten()) < P_FAIL


def test_greedy_tree_follows_the_target_argmax_down_the_tree():
    tokens, parents = [4, 2, 7, 1, 3], [-1, -1, 1, 1, 3]
    logits = torch.full((6, 8), -5.0)
    for row, best in enumerate([2, 0, 1, 3, 9 % 8, 6]):  # row 0: after the last token
        logits[row, best] = 5.0
    # root 2 (node 1) matches row 0; row 2 (after node 1) wants 1 -> node 3; row 4 wants 1: no child -> emit
    emitted, path = verify_tree_greedy(tokens, parents, logits)
    assert path == [1, 3] and emitted == [2, 1, 1]


def test_a_chain_shaped_tree_verifies_like_a_chain():
    g = torch.Generator().manual_seed(5)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=g))
        drafts = torch.randint(0, 4, (k,), generator=g).tolist()
        logits = torch.randn(k + 1, 4, generator=g)
        parents = list(range(-1, k - 1))
        assert is_chain(parents)
        emitted, path = verify_tree_greedy(drafts, parents, logits)
        chain, accepted = verify_greedy(drafts, logits)
        assert (emitted, len(path)) == (chain, accepted) and path == list(range(accepted))


# -- trees in the engine -----------------------------------------------------------------------

from minispec.base.config import SpecConfig  # noqa: E402
from minispec.core.block_manager import BlockManager  # noqa: E402
from minispec.base.kv_cache import KVCache  # noqa: E402
from minispec.core.model_runner import ForwardItem, ModelRunner  # noqa: E402
from minispec.core.request import SamplingParams  # noqa: E402
from minispec.base.tree_shape import canonical_tree  # noqa: E402
from minispec.speculation.tree_drafters import TreeNgramDrafter  # noqa: E402
from minispec.speculation.tree import DraftTree  # noqa: E402

from conftest import KERNELS, tiny_engine  # noqa: E402
from test_spec_exactness import (EAGLE_HEAD, NOISY_DRAFT, TARGET_MODEL, LOGIT_TOL, draft_model_logits,  # noqa: E402
                                 eagle_logits, exact_joint, run)

DRAFTERS = {"draft": NOISY_DRAFT, "eagle": (EAGLE_HEAD, None, None), "ngram": None}
DENSE = {"draft": draft_model_logits(NOISY_DRAFT), "eagle": eagle_logits(EAGLE_HEAD, TARGET_MODEL)}


def wrong_tree_nodes(next_logits, tokens: list[int], drafts: list[int], parents: list[int], topk: int) -> int:
    """How many nodes of a greedy draft tree are not what the drafter's dense continuation of
    their root path ranks there: a parent's first child must be the argmax, every child within
    the top ``topk`` (to LOGIT_TOL of the logit it must reach)."""
    first_child = {}
    wrong = 0
    for i, p in enumerate(parents):
        path, a = [], i
        while a >= 0:
            path.append(drafts[a])
            a = parents[a]
        with torch.no_grad():
            row = next_logits(tokens, path[::-1])[-1]
        need = row.max() if p not in first_child else torch.topk(row, topk).values[-1]
        first_child.setdefault(p, i)
        wrong += float(need - row[drafts[i]]) > LOGIT_TOL * max(1.0, float(row.abs().max()))
    return wrong


class TreeAudit:
    """Every step: the budget, both block pools, every tree within its shape, each greedy tree's
    nodes the drafter's own ranking of its paths; after every verify (checked at the next step),
    the target's cache holds exactly what a fresh prefill of the committed tokens writes."""

    def __init__(self, engine, next_logits=None, topk=1):
        self.engine, self.next_logits, self.topk = engine, next_logits, topk
        self.num_trees = self.num_wrong = self.num_moved = self.num_chunked = 0

    def __call__(self, record):
        engine = self.engine
        assert record.stats.num_tokens <= engine.scheduler.config.max_num_batched_tokens
        engine.block_manager.check_invariants()
        self.num_chunked += any(s.is_prefill and not s.samples for s in record.batch.scheduled)
        for s, out in zip(record.batch.scheduled, record.result.outputs):
            assert len(s.draft_token_ids) <= s.num_draft_tokens
            if s.draft_parents is None:
                continue
            self.num_trees += 1
            assert all(-1 <= p < i for i, p in enumerate(s.draft_parents))
            self.num_moved += bool(out.accepted_nodes) and out.accepted_nodes != list(range(len(out.accepted_nodes)))
            if self.next_logits is not None and s.request.sampling_params.greedy:
                self.num_wrong += wrong_tree_nodes(self.next_logits, s.request.all_token_ids, s.draft_token_ids,
                                                   s.draft_parents, self.topk) > 0


def assert_cache_is_a_fresh_prefill(engine):
    """Each running request's target K/V at positions 0..num_computed-1 equal a fresh causal prefill."""
    runner = engine.runner
    model = runner.model
    for r in engine.scheduler.running:
        n = r.num_computed_tokens
        if n == 0:
            continue
        cfg = model.cfg
        fresh = ModelRunner(model, KVCache(cfg.num_layers, 64, 4, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu"),
                            BlockManager(64, 4), torch.device("cpu"), KERNELS)
        fresh.block_manager.allocate("x", n)
        fresh.forward([ForwardItem("x", r.all_token_ids[:n], 0, 0)])
        bm, fbm = engine.block_manager, fresh.block_manager
        for pos in range(n):
            (a,), (b,) = bm.slots(r.request_id, [pos]), fbm.slots("x", [pos])
            for mine, theirs in ((runner.kv_cache.k, fresh.kv_cache.k), (runner.kv_cache.v, fresh.kv_cache.v)):
                m = mine.view(mine.shape[0], -1, *mine.shape[3:])[:, a]
                t = theirs.view(theirs.shape[0], -1, *theirs.shape[3:])[:, b]
                assert torch.allclose(m, t, atol=1e-4), f"request {r.request_id} position {pos}"


def mixed_requests():
    """Prompts and greedy params: trees, a chain (k 2 per request) and a plain one (k 0) side by side."""
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 12, (int(torch.randint(3, 30, (1,), generator=g)),), generator=g).tolist()
               for _ in range(6)]
    prompts[0] = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repeats: n-gram finds matches
    overrides = [None, None, None, 2, 0, None]
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, num_speculative_tokens=k) for k in overrides]
    return prompts, params


@pytest.mark.parametrize("method", ["draft", "eagle", "ngram"])
@pytest.mark.parametrize("shape", [(3, 2, 5), (4, 4, 8)])
@pytest.mark.parametrize("sched", [dict(), dict(max_num_batched_tokens=9, num_kv_blocks=24, max_model_len=64)],
                         ids=["roomy", "chunked-and-preempting"])
def test_greedy_tree_output_equals_plain_output(method, shape, sched):
    """Trees from the draft model, the EAGLE head and n-gram lookup emit plain greedy decoding's
    tokens, with chunked prefill and preemption (a small budget and pool), in steps that mix trees,
    a chain and a plain request; every tree is the drafter's own ranking; the cache after every
    verify is what a fresh prefill of the committed tokens writes; both pools end empty."""
    prompts, params = mixed_requests()
    plain, _, _ = run(TARGET_MODEL, prompts, params, **sched)
    depth, topk, nodes = shape
    spec = SpecConfig(method="ngram" if method == "ngram" else "draft", num_speculative_tokens=depth, draft_topk=topk,
                      num_draft_tokens=nodes)
    engine = tiny_engine(TARGET_MODEL, spec=spec, draft=DRAFTERS[method], **sched)
    audit = engine.add_observer(TreeAudit(engine, DENSE.get(method), topk))
    ids = [engine.add_request(p, q) for p, q in zip(prompts, params)]
    outs = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o.output_token_ids
        assert_cache_is_a_fresh_prefill(engine)
    assert [outs[i] for i in ids] == plain
    assert audit.num_trees > 0 and audit.num_wrong == 0
    if sched:  # the small pool and budget did what they are there for
        assert any(r.num_preemptions for r in engine.requests.values()) and audit.num_chunked > 0
    if method != "ngram":
        assert audit.num_moved > 0  # some accepted path was not the first nodes: its K/V moved
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    drafter = engine.drafter.inner
    if hasattr(drafter, "block_manager"):
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks


def test_tree_sampling_keeps_the_target_law_in_the_engine():
    """One-sample chi-square of output tokens (1, 2) against the target's exact joint law, with a
    tree of depth 2, 2 children per node and 4 nodes drawn without replacement from a draft model
    that often disagrees with the target."""
    n, prompt = 3000, [1, 2, 3, 4]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=s, ignore_eos=True) for s in range(n)]
    sched = dict(num_kv_blocks=3 * n + 8, max_model_len=10, max_num_seqs=n, max_num_batched_tokens=8 * n)
    spec = SpecConfig(method="draft", num_speculative_tokens=2, draft_topk=2, num_draft_tokens=4)
    outs, engine, ids = run(TARGET_MODEL, [prompt] * n, params, spec, NOISY_DRAFT, **sched)
    joint = exact_joint(TARGET_MODEL, prompt, params[0])
    cells = sorted(joint)
    observed = torch.tensor([sum(tuple(o[:2]) == c for o in outs) for c in cells], dtype=torch.float64)
    assert observed.sum() == n
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    assert 0.2 * n < accepted  # the tree's paths were taken, not only the target's own tokens
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64) * n
    assert chi2_pvalue(observed, expected) > P_FAIL


def test_ngram_tree_merges_matches_into_a_trie():
    drafter = TreeNgramDrafter(1, 2)
    tokens = [7, 1, 2, 3, 9, 1, 2, 5, 9, 1, 2, 3, 4, 9, 1, 2]  # "1 2" was followed by 3, 5 and 3 again
    chain = drafter.lookup(tokens, 3)
    assert chain == [3, 4, 9]
    nodes, parents = drafter.lookup_tree(tokens, 3, 2, 6)
    assert nodes[:3] == chain and parents[:3] == [-1, 0, 1]  # the latest match first: the chain
    assert 5 in nodes and parents[nodes.index(5)] == -1        # a second branch from another match
    assert len(nodes) <= 6 and all(sum(1 for q in parents if q == p) <= 2 for p in set(parents))


def test_greedy_tree_keeps_the_most_likely_nodes_and_topk_one_is_a_chain():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    tree = DraftTree(depth=2, topk=2, num_nodes=3, greedy=True)
    frontier = tree.grow({-1: logits})
    assert [tree.nodes[i].token for i in frontier] == [0, 1]
    tree.grow({frontier[0]: logits, frontier[1]: logits})
    tokens, parents, _, _ = tree.flatten()
    # path probabilities: 0.5, 0.3 at depth 1; 0.25, 0.15 under token 0: keep the three best
    assert (tokens, parents) == ([0, 1, 0], [-1, -1, 0])
    chain = DraftTree(depth=3, topk=1, num_nodes=3, greedy=True)
    for _ in range(3):
        chain.grow({node: logits for node in chain.layer})
    assert chain.flatten()[:2] == ([0, 0, 0], [-1, 0, 1])


def test_canonical_tree_is_the_allocation_rule():
    assert canonical_tree(4, 1, 4) == [-1, 0, 1, 2]
    assert canonical_tree(4, 4, 8) == [-1, -1, -1, -1, 0, 0, 4, 6]
    with pytest.raises(ValueError):
        canonical_tree(5, 2, 4)


# -- issue 32, class 1: a tree's drafting stays within the draft's and the target's limits ---------

from minispec.base.tree_shape import DraftShape  # noqa: E402
from minispec.base.config import EngineConfig, SchedulerConfig  # noqa: E402
from minispec.models.eagle import build_eagle  # noqa: E402
from minispec.models.llama import LlamaModel  # noqa: E402
from minispec.sim import build_sim_engine  # noqa: E402
from minispec.cost.modelspec import ModelSpec  # noqa: E402
from minispec.speculation.policy import make_step_policy  # noqa: E402

from conftest import tiny_config  # noqa: E402
from test_spec_exactness import perturbed  # noqa: E402

EDGE_TARGET = LlamaModel.random(tiny_config(max_position_embeddings=48), seed=0)


def short_draft(limit: int) -> LlamaModel:
    """TARGET_MODEL's weights, noise on the LM head, and a maximum position of ``limit`` tokens."""
    draft = LlamaModel.random(tiny_config(max_position_embeddings=limit))
    draft.load_state_dict(perturbed(TARGET_MODEL, 0.03, seed=7).state_dict())
    return draft


EDGE_CASES = {  # id: (target, draft, max_model_len, the limit drafting must stay below)
    "draft-at-max-model-len": (EDGE_TARGET, perturbed(EDGE_TARGET, 0.03, seed=7), 48, 48),
    "eagle-at-max-model-len": (EDGE_TARGET, (build_eagle(EDGE_TARGET, torch.arange(256)).eval().requires_grad_(False),
                                             None, None), 48, 48),
    "draft-shorter-than-target": (TARGET_MODEL, short_draft(40), 128, 40),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_trees_near_the_length_limit_draft_within_it(case, caplog):
    """Requests run to the maximum length with a tree of depth 3 and topk 4, whose drafting writes
    topk x (depth - 1) = 8 scratch positions past the committed tokens: the last tokens draft
    smaller trees or chains, no draft forward reaches the model's limit (before the fix the
    draft model or EAGLE head raised "a position reaches the model's limit", the step logged a
    warning and an error, and every request of that propose lost its draft state), and greedy
    output stays plain output."""
    target, draft, max_len, limit = EDGE_CASES[case]
    depth, topk = 3, 4
    prompts = [list(range(1, 31)), [5, 9, 2, 7] * 3, list(range(40, 62))]
    params = SamplingParams(max_tokens=max_len, temperature=0, ignore_eos=True)
    plain, _, _ = run(target, prompts, params, max_model_len=max_len)
    spec = SpecConfig(method="draft", num_speculative_tokens=depth, draft_topk=topk, num_draft_tokens=8)
    near_end = []

    def watch(record):
        for s in record.batch.scheduled:
            if s.draft_parents is not None:
                near_end.append(s.request.num_tokens + topk * (s.num_speculative_tokens - 1))

    with caplog.at_level("WARNING", logger="minispec"):
        engine = tiny_engine(target, spec=spec, draft=draft, max_model_len=max_len)
        engine.add_observer(watch)
        ids = [engine.add_request(p, params) for p in prompts]
        outs = {o.request_id: o.output_token_ids for o in engine.run_until_done()}
    assert not [r.getMessage() for r in caplog.records]
    assert [outs[i] for i in ids] == plain
    assert max(near_end) < limit                     # every scratch slot within the draft's limit
    assert max(near_end) > limit - 1 - topk          # and trees were still drafted that close to it
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    drafter = engine.drafter.inner
    assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks
    engine.block_manager.check_invariants()
    drafter.block_manager.check_invariants()


# -- issue 32, class 2: a tree reserves only the nodes its shape holds ----------------------------

@pytest.mark.parametrize("k, topk, nodes, most", [(2, 2, 8, 6), (1, 2, 8, 2), (3, 4, 64, 36)])
def test_tree_shapes_that_hold_fewer_nodes_are_refused_by_name(k, topk, nodes, most):
    """A tree of depth k expands topk nodes per depth: it holds topk + (k - 1) x topk^2 nodes. A
    shape asking for more is refused by the config, a schedule policy, the shape type and the
    simulator's canonical tree, each message naming the values and what is allowed."""
    with pytest.raises(ValueError, match=rf"num_draft_tokens={nodes}.*at most .*{most}"):
        SpecConfig(method="draft", num_speculative_tokens=k, draft_topk=topk, num_draft_tokens=nodes)
    with pytest.raises(ValueError, match=rf"schedule part '1-2:{k}/{topk}/{nodes}'.*num_nodes={nodes}.*<= {most}"):
        make_step_policy(f"schedule:1-2:{k}/{topk}/{nodes},3-:0", 4)
    for build in (lambda: DraftShape(k, topk, nodes), lambda: canonical_tree(k, topk, nodes)):
        with pytest.raises(ValueError, match=rf"depth={k}, topk={topk}, num_nodes={nodes}.*<= {most}"):
            build()
    SpecConfig(method="draft", num_speculative_tokens=k, draft_topk=topk, num_draft_tokens=most)  # the most is fine


def test_a_tree_clamped_near_max_tokens_reserves_what_its_shape_holds():
    """Depth 3, topk 2, 5 nodes; one output token left to draft for: the clamp cuts the depth to
    1, where a tree of topk 2 holds 2 nodes, so 2 budget tokens and 2 KV slots are reserved (before
    the fix: 5), and the draft model drafts exactly what was reserved."""
    spec = SpecConfig(method="draft", num_speculative_tokens=3, draft_topk=2, num_draft_tokens=5)
    engine = tiny_engine(TARGET_MODEL, spec=spec, draft=NOISY_DRAFT)
    shapes = []

    def watch(record):
        for s in record.batch.scheduled:
            if s.num_speculative_tokens:
                shapes.append((s.num_speculative_tokens, s.draft_topk, s.num_draft_tokens, len(s.draft_token_ids)))

    engine.add_observer(watch)
    prompts = [[1, 2, 3, 4, 5], [9, 8, 7]]
    for p, max_tokens in zip(prompts, (3, 4)):
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    engine.run_until_done()
    assert (1, 2, 2, 2) in shapes
    for depth, topk, reserved, drafted in shapes:
        assert reserved <= topk + (depth - 1) * topk * topk and drafted == reserved
    assert engine.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("max_tokens", [3, 4])
def test_the_simulator_prices_and_counts_the_nodes_a_clamped_tree_holds(max_tokens):
    """The simulator reserves, pads (and so verifies and counts as proposed) exactly the nodes of
    the tree it prices (``canonical_tree`` of the clamped shape): before the fix a tree of 3/2/5
    clamped to depth 1 reserved and padded 5 drafts for a 2-node tree."""
    config = EngineConfig(model="tiny", seed=0, block_size=4, num_kv_blocks=64, max_model_len=64,
                          enable_prefix_caching=False, scheduler=SchedulerConfig(max_num_batched_tokens=64),
                          spec=SpecConfig(method="synthetic", num_speculative_tokens=3, draft_topk=2,
                                          num_draft_tokens=5, alpha=0.9))
    engine = build_sim_engine(config, hardware="h100", model=ModelSpec.of(tiny_config(), "float32"))
    trees = []
    engine.add_observer(lambda record: trees.extend(
        (s.num_draft_tokens, len(s.draft_token_ids), len(s.draft_parents))
        for s in record.batch.scheduled if s.draft_parents is not None))
    engine.add_request([3] * 6, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    engine.run_until_done()
    assert trees and all(len(set(t)) == 1 for t in trees), trees


# -- issue 32: one definition of what a tree shape holds -----------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minispec.base.tree_shape import node_depths  # noqa: E402
from minispec.base.tree_shape import fit_tree, max_tree_nodes, tree_scratch_positions, tree_shape_error  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(depth=st.integers(1, 8), topk=st.integers(1, 8), extra=st.integers(0, 80),
       room=st.tuples(st.integers(-3, 20), st.integers(-3, 40), st.integers(-3, 40)))
def test_a_fitted_shape_is_one_the_drafters_can_fill_within_the_room(depth, topk, extra, room):
    """``fit_tree`` returns a valid shape no larger than the one asked for, whose depth, nodes,
    verify positions and drafting scratch all fit the request's room; a chain stays a chain."""
    num_nodes = min(depth + extra, max_tree_nodes(depth, topk))
    max_depth, max_nodes, max_positions = room
    d, n = fit_tree(depth, topk, num_nodes, max_depth, max_nodes, max_positions)
    assert tree_shape_error(d, topk, n) is None
    assert 0 <= d <= depth and n <= num_nodes
    if d:
        assert d <= max_depth and n <= max_nodes and n <= max_positions
        assert tree_scratch_positions(d, topk) <= max_positions
    if topk == 1:
        assert n == d


@pytest.mark.parametrize("depth, topk", [(1, 2), (2, 2), (3, 2), (4, 2), (4, 3), (3, 4), (5, 8)])
def test_the_canonical_tree_is_one_the_drafters_grow(depth, topk):
    """For every node count the shape holds, the simulator's tree has that many nodes, reaches its
    depth, and hangs each depth's nodes under the topk first nodes of the depth above (the drafters
    expand only those; before, a depth-4 topk-2 tree of 12 nodes hung depth 3 under 3 parents)."""
    for num_nodes in range(depth, max_tree_nodes(depth, topk) + 1):
        parents = canonical_tree(depth, topk, num_nodes)
        depths = node_depths(parents)
        assert len(parents) == num_nodes and max(depths) == depth
        for d in range(2, depth + 1):
            above = [i for i, x in enumerate(depths) if x == d - 1][:topk]
            assert all(parents[i] in above for i, x in enumerate(depths) if x == d), (num_nodes, parents)


def test_a_depth_0_shape_s_message_gives_no_negative_formula():
    """tree_shape_error(0, 4, 3) said "topk + (depth - 1) x topk^2 = 0", a formula giving -12 there."""
    from minispec.base.tree_shape import tree_shape_error

    message = tree_shape_error(0, 4, 3)
    assert "depth=0, topk=4, num_nodes=3" in message and "(depth - 1)" not in message
    assert "holds exactly depth nodes" in message
