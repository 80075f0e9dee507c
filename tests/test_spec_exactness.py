"""Speculative decoding is exact: greedy output equals plain greedy output token for token, and
rejection sampling keeps the target's distribution (Leviathan et al. 2023, Theorem 3.5 / App. A.1).

Statistical tests use Pearson's chi-square with a false-failure probability of 1e-4 each (the
p-value threshold); the seeds are fixed, so a run is reproducible.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minispec.config import SpecConfig
from minispec.models.llama import LlamaModel
from minispec.models.eagle import build_eagle
from minispec.request import SamplingParams
from minispec.sampling import DRAFT_DRAW, logits_to_probs
from minispec.spec.verify import request_draws, verify_sampled

from conftest import tiny_config, tiny_engine

P_FAIL = 1e-4  # false-failure odds of each chi-square test


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson chi-square p-value, cells with expected count < 5 merged into one."""
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = (obs, exp) if exp[-1] >= 5 else (obs[:-1], exp[:-1])
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def two_sample_pvalue(a: torch.Tensor, b: torch.Tensor) -> float:
    """Chi-square test of homogeneity for two count vectors over the same cells."""
    keep = (a + b) >= 10
    a, b = a[keep].double(), b[keep].double()
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = ((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum()
    df = len(a) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


TARGET = torch.tensor([[0.05, 0.10, 0.40, 0.05, 0.25, 0.15],
                       [0.30, 0.05, 0.05, 0.20, 0.10, 0.30],
                       [0.10, 0.10, 0.10, 0.20, 0.20, 0.30]])
DRAFT = torch.tensor([[0.30, 0.30, 0.10, 0.10, 0.10, 0.10],
                      [0.05, 0.05, 0.60, 0.10, 0.10, 0.10]])


def first_token_counts(verify, n=20000, seed=0):
    """Emit with k=2 drafts n times; count the first emitted token and the second given acceptance."""
    g = torch.Generator().manual_seed(seed)
    first = torch.zeros(6)
    second = torch.zeros(6)
    for _ in range(n):
        drafts = [int(torch.multinomial(DRAFT[i], 1, generator=g)) for i in range(2)]
        emitted, _ = verify(drafts, DRAFT, TARGET, g)
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first, second


def test_rejection_sampling_keeps_target_distribution():
    first, second = first_token_counts(verify_sampled)
    assert chi2_pvalue(first, TARGET[0] * first.sum()) > P_FAIL
    assert chi2_pvalue(second, TARGET[1] * second.sum()) > P_FAIL


def faulty_reuses_acceptance_draw(drafts, draft_probs, target_probs, g):
    """Fault: the residual is sampled by inverting its CDF with the acceptance draw itself."""
    for i, d in enumerate(drafts):
        u = float(torch.rand(1, generator=g))
        if u < float(target_probs[i, d] / draft_probs[i, d]):
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        cdf = (residual / residual.sum()).cumsum(0)
        return drafts[:i] + [int(torch.searchsorted(cdf, torch.tensor(u)).clamp(max=5))], i
    return drafts + [int(torch.multinomial(target_probs[len(drafts)], 1, generator=g))], len(drafts)


def faulty_argmax_draft(drafts, draft_probs, target_probs, g):
    """Fault: the draft proposes its argmax but is scored with its full probabilities."""
    greedy_drafts = [int(draft_probs[i].argmax()) for i in range(len(drafts))]
    return verify_sampled(greedy_drafts, draft_probs, target_probs, g)


def test_chi_square_catches_classic_faults():
    for faulty in (faulty_reuses_acceptance_draw, faulty_argmax_draft):
        first, _ = first_token_counts(faulty, n=20000, seed=1)
        assert chi2_pvalue(first, TARGET[0] * first.sum()) < 1e-6, faulty.__name__


def test_deterministic_drafter_residual_is_exact():
    """An n-gram proposal has draft probability 1: the residual is the target without that token."""
    g = torch.Generator().manual_seed(3)
    counts = torch.zeros(6)
    for _ in range(20000):
        emitted, _ = verify_sampled([2], None, TARGET[:2], g)
        counts[emitted[0]] += 1
    assert chi2_pvalue(counts, TARGET[0] * counts.sum()) > P_FAIL


def run(model, prompts, params, spec=None, draft=None, **sched):
    engine = tiny_engine(model, spec=spec, draft=draft, **sched)
    ids = [engine.add_request(p, params[i] if isinstance(params, list) else params) for i, p in enumerate(prompts)]
    outs = {o.request_id: o for o in engine.run_until_done()}
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    drafter = engine.executor.drafter
    if drafter is not None and hasattr(drafter, "block_manager"):
        assert drafter.block_manager.num_free_blocks == drafter.block_manager.num_blocks
        assert not drafter.progress.num_cached
    return [outs[i].output_token_ids for i in ids], engine, ids


TARGET_MODEL = LlamaModel.random(tiny_config(), seed=0)
OTHER_DRAFT = LlamaModel.random(tiny_config(num_layers=1), seed=5)


def perturbed(model: LlamaModel, scale: float, seed: int) -> LlamaModel:
    """A copy of ``model`` with noise on its LM head: a draft that agrees often, not always."""
    copy = LlamaModel.random(model.cfg)
    copy.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        copy.lm_head.add_(scale * torch.randn(copy.lm_head.shape, generator=g))
    return copy


NOISY_DRAFT = perturbed(TARGET_MODEL, 0.03, seed=7)
EAGLE_HEAD = build_eagle(TARGET_MODEL, torch.arange(TARGET_MODEL.cfg.vocab_size)).eval().requires_grad_(False)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), method=st.sampled_from(["ngram", "self", "other", "eagle"]), k=st.integers(1, 8),
       budget=st.sampled_from([7, 16, 64]), num_blocks=st.sampled_from([40, 200]))
def test_greedy_speculative_equals_greedy_plain(data, method, k, budget, num_blocks):
    n = data.draw(st.integers(1, 6))
    prompts = [data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=40)) for _ in range(n)]
    params = [SamplingParams(max_tokens=data.draw(st.integers(1, 30)), temperature=0, ignore_eos=True,
                             num_speculative_tokens=data.draw(st.sampled_from([None, None, 0, 2])))
              for _ in range(n)]
    plain, _, _ = run(TARGET_MODEL, prompts, params, num_kv_blocks=num_blocks, max_num_batched_tokens=budget)
    spec = SpecConfig(method="ngram" if method == "ngram" else "draft", num_speculative_tokens=k)
    draft = {"self": TARGET_MODEL, "other": OTHER_DRAFT, "eagle": (EAGLE_HEAD, None, None)}.get(method)
    fast, engine, ids = run(TARGET_MODEL, prompts, params, spec, draft, num_kv_blocks=num_blocks,
                            max_num_batched_tokens=budget)
    assert fast == plain
    if method == "self":
        for rid in ids:
            r = engine.requests[rid]
            assert r.num_draft_accepted == r.num_draft_proposed


def test_self_draft_accepts_everything_and_keeps_kv_lengths_consistent():
    spec = SpecConfig(method="draft", num_speculative_tokens=4)
    engine = tiny_engine(TARGET_MODEL, spec=spec, draft=TARGET_MODEL)
    rid = engine.add_request(list(range(10)), SamplingParams(max_tokens=41, temperature=0, ignore_eos=True))
    drafter = engine.executor.drafter
    while engine.has_unfinished():
        engine.step()
        r = engine.requests[rid]
        if r.finished:
            break
        # the target holds K/V for all but the newest token; the draft never runs ahead of the target's
        # kept tokens by more than the k - 1 drafts it wrote last step
        assert r.num_computed_tokens == r.num_tokens - 1
        assert drafter.progress.num_cached.get(rid, 0) <= r.num_tokens + 3
    r = engine.requests[rid]
    assert r.num_draft_accepted == r.num_draft_proposed > 0
    assert r.num_verify_emitted / r.num_verify_steps == 5.0  # k + 1 every verify step
    assert r.num_output_tokens == 41


def exact_joint(model, prompt, params):
    """The target's exact law of output tokens 1 and 2: {(t1, t2): probability}."""
    from minispec.sampling import logits_to_probs

    with torch.no_grad():
        p1 = logits_to_probs(model.forward_dense(torch.tensor([prompt]))[0, -1:], params)[0]
        joint = {}
        for t1 in p1.nonzero().flatten().tolist():
            p2 = logits_to_probs(model.forward_dense(torch.tensor([prompt + [t1]]))[0, -1:], params)[0]
            for t2 in p2.nonzero().flatten().tolist():
                joint[(t1, t2)] = float(p1[t1] * p2[t2])
    return joint


def test_speculative_sampling_keeps_distribution_in_the_engine():
    """One-sample chi-square of output tokens (1, 2) against the target's exact joint law; token 2
    comes from a verify step (k = 1) with a draft model that often disagrees with the target."""
    n, prompt = 3000, [1, 2, 3, 4]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=s, ignore_eos=True) for s in range(n)]
    sched = dict(num_kv_blocks=2 * n + 8, max_model_len=8, max_num_seqs=n, max_num_batched_tokens=8 * n)
    spec = SpecConfig(method="draft", num_speculative_tokens=1)
    outs, engine, ids = run(TARGET_MODEL, [prompt] * n, params, spec, NOISY_DRAFT, **sched)
    proposed = sum(engine.requests[i].num_draft_proposed for i in ids)
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    assert proposed == n and 0.1 * n < accepted < 0.9 * n  # both acceptance and rejection paths ran
    joint = exact_joint(TARGET_MODEL, prompt, params[0])
    cells = sorted(joint)
    observed = torch.tensor([sum(tuple(o[:2]) == c for o in outs) for c in cells], dtype=torch.float64)
    assert observed.sum() == n  # no token outside the target's support
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64) * n
    assert chi2_pvalue(observed, expected) > P_FAIL


def test_confidence_threshold_keeps_the_target_law_and_a_token_probability_rule_would_not(monkeypatch):
    """Drafting only where the draft is confident (SpecConfig.draft_confidence_threshold) reads the
    draft distribution before the draw, so the output keeps the target's joint law of tokens (1, 2).
    Dropping a drawn token for its own low probability instead would verify tokens drawn from the
    draft restricted to its likely tokens, not from the draft: the same chi-square rejects that."""
    from minispec.spec.drafters import DraftModelDrafter

    n, prompt = 3000, [1, 2, 3, 4]
    params = [SamplingParams(max_tokens=3, temperature=1.0, top_k=4, seed=s, ignore_eos=True) for s in range(n)]
    sched = dict(num_kv_blocks=2 * n + 8, max_model_len=8, max_num_seqs=n, max_num_batched_tokens=8 * n)
    # 0.27 lies inside the spread of NOISY_DRAFT's top-4 maximum probabilities on this prompt:
    # about half the requests draft token 2 and half decode it plainly
    spec = SpecConfig(method="draft", num_speculative_tokens=1, draft_confidence_threshold=0.27)
    joint = exact_joint(TARGET_MODEL, prompt, params[0])
    cells = sorted(joint)
    expected = torch.tensor([joint[c] for c in cells], dtype=torch.float64) * n

    def pvalue(outs):
        observed = torch.tensor([sum(tuple(o[:2]) == c for o in outs) for c in cells], dtype=torch.float64)
        assert observed.sum() == n
        return chi2_pvalue(observed, expected)

    outs, engine, ids = run(TARGET_MODEL, [prompt] * n, params, spec, NOISY_DRAFT, **sched)
    proposed = sum(engine.requests[i].num_draft_proposed for i in ids)
    accepted = sum(engine.requests[i].num_draft_accepted for i in ids)
    assert 0.2 * n < proposed < 0.8 * n and 0.1 * proposed < accepted < 0.9 * proposed
    assert pvalue(outs) > P_FAIL

    def token_probability_rule(self, s, logits):  # the fault: keep only drafts the draft found likely
        probs = logits_to_probs(self.to_target_vocab(logits), s.request.sampling_params)
        token = request_draws(s).sample(probs[0], len(s.draft_token_ids), DRAFT_DRAW)
        if float(probs[0, token]) < self.confidence_threshold:
            return False
        s.draft_token_ids.append(token)
        s.draft_probs.append(probs[0])
        return True

    monkeypatch.setattr(DraftModelDrafter, "append_draft", token_probability_rule)
    faulty, _, _ = run(TARGET_MODEL, [prompt] * n, params,
                       SpecConfig(method="draft", num_speculative_tokens=1, draft_confidence_threshold=0.25),
                       NOISY_DRAFT, **sched)
    assert pvalue(faulty) < P_FAIL


# -- issue 15, fault 3: drafted ids outside [0, V) are rejections, never output ----------------------

def test_draft_ids_outside_the_vocabulary_are_rejected_and_the_target_law_holds():
    from minispec.spec.verify import verify_greedy

    vocab = TARGET.shape[-1]
    for bad in (-1, vocab, vocab + 7):
        for draft_probs in (None, DRAFT[:1]):
            g = torch.Generator().manual_seed(0)
            counts = torch.zeros(vocab)
            for _ in range(4000):
                emitted, accepted = verify_sampled([bad], draft_probs, TARGET[:2], g)
                assert accepted == 0 and len(emitted) == 1
                counts[emitted[0]] += 1
            assert chi2_pvalue(counts, TARGET[0] * counts.sum()) > P_FAIL
        emitted, accepted = verify_greedy([bad], torch.log(TARGET[:2]))
        assert accepted == 0 and emitted == [int(TARGET[0].argmax())]
    # a good first draft is still judged, then the bad second one ends the run
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        emitted, accepted = verify_sampled([2, -1], None, TARGET, g)
        assert accepted <= 1 and all(0 <= t < vocab for t in emitted)


# -- issue 15, fault 5: a seeded request's random numbers are keyed by position -------------------

def test_seeded_draws_make_a_verify_independent_of_k_up_to_the_first_rejection():
    """With draws keyed by (seed, output position), the outcome at a draft position depends only on
    that position: a verify of 2 drafts and one of 4 agree whenever the first rejection falls in the
    first two positions (with one generator drawn in order, the residual draw would move with k)."""
    from minispec.sampling import DRAFT_DRAW, SeededDraws

    target = torch.cat([TARGET, TARGET[:2]])  # [5, V]: k = 4 needs k + 1 rows
    draft = torch.cat([DRAFT, DRAFT])          # [4, V]
    compared = 0
    for seed in range(300):
        draws = SeededDraws(seed, start=7)
        drafts = [draws.sample(draft[i], i, DRAFT_DRAW) for i in range(4)]
        four, a4 = verify_sampled(drafts, draft, target, draws)
        two, a2 = verify_sampled(drafts[:2], draft[:2], target[:3], draws)
        again, _ = verify_sampled(drafts, draft, target, SeededDraws(seed, start=7))
        assert again == four  # the same seed and position: the same outcome
        if a4 < 2:
            compared += 1
            assert two == four and a2 == a4
    assert compared > 50
