"""Notebook 07's exercises (notebooks/07_policies.ipynb): a threshold from a speedup curve and a
threshold policy that does not thrash.
"""

from __future__ import annotations

from course.checks import check_function, run_check
from course.exercises.messenger_vs_truck import reference_first_losing_concurrency
from course.scenarios import policy_run


def reference_threshold(rows: list[dict], method: str) -> int:
    """Largest concurrency below the first losing one (the N for a threshold:N policy)."""
    first = reference_first_losing_concurrency(rows, method)
    ok = [r["concurrency"] for r in rows if r["spec"] == method
          and (first is None or r["concurrency"] < first)]
    return max(ok) if ok else 0


def check_07_threshold(fn, quiet=False) -> str:
    def rows(speedups):
        return [{"spec": "draft", "concurrency": c, "speedup_vs_off": s} for c, s in speedups]
    inputs = [rows([(1, 1.6), (8, 1.2), (32, 0.95), (64, 0.8)]),
              rows([(1, 1.6), (8, 1.2), (16, 1.01), (32, 1.2), (64, 0.8)]),
              rows([(1, 0.9), (4, 0.8)]), rows([(1, 1.3), (128, 1.1)]),
              rows([(1, 1.5), (8, 0.9), (32, 1.05), (64, 0.8)])]  # the last: a win after a loss
    cases = [((r, "draft"), reference_threshold(r, "draft")) for r in inputs]
    return check_function("07 threshold from a speedup curve", fn, cases, quiet=quiet)


def check_07_thrash(policy_class, threshold: int = 16, k: int = 4, quiet=False) -> str:
    """The failure-modes lab's exercise: ``policy_class(k, threshold)`` is a SpecPolicy that must
    (1) speculate while few requests are held and not while many are, and stay off through a dip
    of one step (a cohort finishing), yet come back on once the load stayed low for 32 steps; and
    (2) on the lab's simulated H100 workload (``scenarios.LAB``), keep p90 TPOT within 3% of spec
    off's and throughput within 0.5% of it at 24 and 32 requests, and at least 95% of always'
    throughput at 8 (the targets of issue 34)."""
    def test():
        policy = policy_class(k, threshold)

        def ks(loads):
            return [int(policy.choose_k([object()] * n, n)) for n in loads]
        low = ks([4] * 8)
        if not all(low):
            return False, (f"with 4 requests held the policy gave k={low}: it should "
                           "speculate while few are held")
        busy = ks([4 * threshold] * 8)
        if any(busy):
            return False, (f"with {4 * threshold} requests held it gave k={busy[-1]}: it "
                           "should not speculate then")
        dip = ks([threshold // 2] + [4 * threshold] * 3)
        if any(dip):
            return False, (f"a load that dipped to {threshold // 2} for one step (a cohort finishing, the "
                           f"next requests not yet admitted) switched speculation on (k={dip}): look back "
                           "over more than one step")
        back = ks([threshold // 2] * 32)
        if not back[-1]:
            return False, (f"after 32 steps at {threshold // 2} requests it still gave k=0: "
                           "it never comes back on")
        for c in (24, 32):
            mine, _ = policy_run(policy_class(k, threshold), c)
            never, _ = policy_run("never", c)
            if (mine["tpot_p90_s"] > 1.03 * never["tpot_p90_s"]
                or mine["throughput_tok_s"] < 0.995 * never["throughput_tok_s"]):
                return False, (f"at {c} requests: p90 TPOT {1000 * mine['tpot_p90_s']:.2f} ms against spec "
                               f"off's {1000 * never['tpot_p90_s']:.2f}, throughput "
                               f"{mine['throughput_tok_s']:.0f} against {never['throughput_tok_s']:.0f} "
                               "tok/s: which count does it read?")
        mine, _ = policy_run(policy_class(k, threshold), 8)
        always, _ = policy_run("always", 8)
        if mine["throughput_tok_s"] < 0.95 * always["throughput_tok_s"]:
            return False, ("at 8 requests it kept "
                           f"{mine['throughput_tok_s'] / always['throughput_tok_s']:.0%} of always' "
                           "throughput (goal 95%)")
        return True, (f"no dip switches it on; at 24 and 32 requests it matches spec off, at 8 it keeps "
                      f"{mine['throughput_tok_s'] / always['throughput_tok_s']:.0%} of always' throughput")
    return run_check("07 a threshold that does not thrash", test,
                     attempted=policy_class is not None, quiet=quiet)
