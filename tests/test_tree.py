"""Draft trees: verification keeps the target's law (greedy and sampled), and a chain is a tree.

The sampled tests are Pearson chi-square tests with a false-failure probability of 1e-4 each
(P_FAIL), on the joint law of the first two tokens: a verify emits the second token only when the
first was an accepted node, so when it stopped after one token the test draws the second from
the target itself, as the next step would. The seeds are fixed, so a run is reproducible.
"""

import pytest
import torch

from minispec.sampling import SeededDraws
from minispec.spec.verify import is_chain, tree_children, verify_greedy, verify_tree_greedy, verify_tree_sampled

from test_spec_exactness import P_FAIL, chi2_pvalue

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
    import minispec.spec.verify as verify

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
