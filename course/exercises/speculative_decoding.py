"""Notebook 04's exercises (notebooks/04_speculative_decoding.ipynb): expected tokens per verify step,
greedy verification, then the learner's greedy verify and speculation policy inside the engine, judged
by what the engine's own tests check: greedy speculation equals plain decoding token for token.
"""

from __future__ import annotations

from course.checks import check_function, run_check
from course.exercises.harness import (LearnerPolicy, LearnerVerifyDrafter, _course_prompts, _engine,
                                      _first_difference, _generate, tiny_course_model)
from minispec.base.config import SpecConfig
from minispec.core.support.metrics import request_metrics
from minispec.cost.model import expected_accepted_length, leviathan_speedup
from minispec.tools.summary import summarize


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Mean tokens emitted per verify step, bonus included (Leviathan et al. 2023, eq. 1)."""
    return expected_accepted_length(alpha, k)


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """Walltime improvement at batch 1 with a draft step costing c target steps (Leviathan et al.
    2023, Theorem 3.8)."""
    return leviathan_speedup(alpha, k, c)


def check_04_expected_tokens(fn, quiet=False) -> str:
    cases = [((a, k), expected_tokens_per_step(a, k)) for a in (0.0, 0.3, 0.6, 0.8, 0.95) for k in (1, 4, 7)]
    cases.append(((1.0, 4), 5.0))
    return check_function("04 expected tokens per verify step", fn, cases, rel=1e-6, quiet=quiet)


def reference_greedy_verify(draft: list[int], target_argmax: list[int]) -> list[int]:
    """Accepted drafts then the target's token at the first mismatch (or the bonus token)."""
    out = []
    for d, t in zip(draft, target_argmax):
        if d != t:
            return out + [t]
        out.append(d)
    return out + [target_argmax[len(draft)]]


def check_04_greedy_verify(fn, quiet=False) -> str:
    cases = [(([5, 6, 7], [5, 6, 7, 8]), [5, 6, 7, 8]), (([5, 6, 7], [5, 9, 7, 8]), [5, 9]),
             (([1], [2, 3]), [2]), (([], [4]), [4]), (([3, 3], [3, 3, 3]), [3, 3, 3])]

    def test():
        for args, expected in cases:
            got = list(fn(*[list(a) for a in args]))
            if got != expected:
                return False, f"greedy_verify{args} returned {got}, expected {expected}"
        return True, f"all {len(cases)} cases agree"
    return run_check("04 greedy verification", test, attempted=fn is not None, quiet=quiet)


# 04: a greedy verify inside the engine, through the Drafter protocol
def check_04_verify_in_engine(greedy_verify, model=None, tokenizer=None,
                              max_tokens: int = 24, quiet=False) -> str:
    """``greedy_verify`` replaces the engine's verify (no fault guard around it): pass when n-gram
    speculation with it gives plain decoding's output token for token and it verified drafts."""
    def test():
        # called once outside the engine first: an unwritten exercise (NotImplementedError) is "not
        # attempted" here, where inside the engine its guard would fail the requests with a traceback
        greedy_verify([5, 6], [5, 7, 8])
        prompts = _course_prompts(tokenizer, "copy", 2)
        engine = _engine(model or tiny_course_model(), tokenizer,
                         SpecConfig(method="ngram", num_speculative_tokens=4))
        drafter = LearnerVerifyDrafter(greedy_verify)
        engine.drafter = drafter  # in place of the guarded one: a wrong verify shows
        plain = _generate(engine, prompts, max_tokens, plain=True)
        outputs = _generate(engine, prompts, max_tokens)
        if drafter.disagreements:
            return False, f"{len(drafter.disagreements)} of {drafter.num_verifies} verifies differ, first: " \
                          f"{drafter.disagreements[0]}"
        diff = _first_difference(outputs, plain)
        if diff:
            return False, diff + ": a verify must accept only drafts equal to the target's argmax"
        if not drafter.num_verifies:
            return False, "the engine never asked your verify (no drafts were found): try other prompts"
        stats = summarize([r for r in engine.requests.values() if r.num_verify_steps], 1.0)
        return True, (f"output equals plain decoding token for token; your verify ran {drafter.num_verifies} "
                      f"times and accepted {stats['num_draft_accepted']} of {stats['num_draft_proposed']} "
                      f"drafts (acceptance rate {stats['acceptance_rate']:.2f}, "
                      f"{stats['mean_accepted_length']:.2f} tokens per verify step)")
    return run_check("04 your greedy verify inside the engine", test, attempted=greedy_verify is not None,
                     quiet=quiet)


# 04: a speculation policy inside the scheduler
def reference_choose_k(num_running: int, k: int) -> int:
    """k drafts while at most 2 requests run (a small batch: verify positions nearly free), else 0."""
    return k if num_running <= 2 else 0


def check_04_policy_in_engine(choose_k, model=None, tokenizer=None, k: int = 4, quiet=False) -> str:
    """``choose_k`` runs as the scheduler's speculation policy over three requests that finish one
    after another: pass when every step's k follows the rule (k while at most 2 run, 0 above),
    both kinds of step happened, and the output equals plain decoding token for token."""
    def test():
        prompts = _course_prompts(tokenizer, "copy", 3)
        lengths = [8, 12, 16]
        policy = LearnerPolicy(choose_k, k)
        engine = _engine(model or tiny_course_model(), tokenizer,
                         SpecConfig(method="ngram", num_speculative_tokens=k),
                         policy=policy)
        plain = _generate(engine, prompts, lengths, plain=True)
        policy.decisions.clear()  # the plain run opted out: only the speculating run's steps count
        outputs = _generate(engine, prompts, lengths)
        wrong = [(n, got) for n, got in policy.decisions if got != reference_choose_k(n, k)]
        if wrong:
            n, got = wrong[0]
            return False, (f"with {n} requests running the policy gave k={got}; the rule asks "
                           f"{reference_choose_k(n, k)}")
        if {bool(got) for _, got in policy.decisions} != {True, False}:
            return False, "the run never had both a speculating and a plain step: check the rule's threshold"
        diff = _first_difference(outputs, plain)
        if diff:
            return False, diff
        mine = [r for r in engine.requests.values() if r.sampling_params.num_speculative_tokens is None]
        stats = summarize(mine, 1.0)
        spec_steps = sum(1 for _, got in policy.decisions if got)

        def tpot_ms(reqs) -> float:  # the mean of the requests' TPOT, each request's own
            return 1000 * sum(request_metrics(r)["tpot_s"] for r in reqs) / len(reqs)
        plain_reqs = [r for r in engine.requests.values() if r.sampling_params.num_speculative_tokens == 0]
        ours, theirs = tpot_ms(mine), tpot_ms(plain_reqs)
        return True, (f"{spec_steps} of {len(policy.decisions)} decode steps speculated (at most 2 running), "
                      f"the rest decoded plainly; acceptance rate {stats['acceptance_rate']:.2f}; output "
                      f"equals plain decoding token for token. Your policy's mean TPOT {ours:.2f} ms against "
                      f"{theirs:.2f} ms with speculation off ({theirs / ours:.2f}x; one short run of each, "
                      "so read it as a sketch: the k sweep above compares in rounds)")
    return run_check("04 your speculation policy inside the scheduler", test, attempted=choose_k is not None,
                     quiet=quiet)
