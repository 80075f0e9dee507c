"""Metrics computed from timestamps recorded on a fake clock give exact, hand-checked values."""

import logging
from types import SimpleNamespace

import pytest

from minispec.core.support.metrics import request_metrics
from minispec.tools.summary import percentile, summarize
from minispec.core.request import Request, RequestStatus, SamplingParams
from minispec.speculation.acceptance_watch import AcceptanceWatch
from minispec.tools.summary import StepLog
from minispec.base.config import SpecConfig
from course import quiet_engine_log

from conftest import tiny_engine


def make_request(rid, arrival, token_times, finish, status=RequestStatus.FINISHED_LENGTH):
    r = Request(rid, [1, 2, 3], SamplingParams(max_tokens=10), arrival_time_s=arrival)
    r.output_token_ids = [5] * len(token_times)
    r.token_times_s = list(token_times)
    r.first_token_time_s = token_times[0]
    r.finish_time_s = finish
    r.status = status
    return r


def test_request_metrics_by_hand():
    r = make_request("a", 1.0, [1.5, 1.7, 2.0, 2.1], 2.1)
    m = request_metrics(r)
    assert m["ttft_s"] == pytest.approx(0.5)
    assert m["tpot_s"] == pytest.approx((2.1 - 1.5) / 3)
    assert m["itl_s"] == pytest.approx([0.2, 0.3, 0.1])
    assert m["e2e_s"] == pytest.approx(1.1)


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([10], 99) == 10
    assert percentile([], 50) is None


def test_summary_throughput_and_goodput():
    fast = make_request("fast", 0.0, [0.1, 0.2, 0.3], 0.3)           # TTFT 0.1, TPOT 0.1
    slow = make_request("slow", 0.0, [1.0, 1.5, 2.0], 2.0)           # TTFT 1.0, TPOT 0.5
    aborted = make_request("ab", 0.0, [0.2], 0.4, RequestStatus.FINISHED_ABORTED)
    s = summarize([fast, slow, aborted], wall_s=2.0, ttft_slo_s=0.5, tpot_slo_s=0.2)
    assert s["throughput_tok_s"] == pytest.approx(7 / 2.0)
    assert s["goodput_rps"] == pytest.approx(1 / 2.0)                 # only "fast" meets both SLOs
    assert summarize([fast, slow], wall_s=2.0)["goodput_rps"] == pytest.approx(1.0)
    assert s["ttft_p50_s"] == pytest.approx(0.2)


def test_engine_records_times_on_its_clock(tiny_model):
    ticks = iter(i * 0.5 for i in range(10_000))
    engine = tiny_engine(tiny_model)
    log = engine.add_observer(StepLog())
    engine.clock = lambda: next(ticks)
    engine.executor.clock = engine.clock
    rid = engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    engine.run_until_done()
    m = request_metrics(engine.requests[rid])
    # each step reads the clock a fixed number of times, so every gap is a whole number of ticks
    assert m["ttft_s"] > 0 and all(abs(x / 0.5 - round(x / 0.5)) < 1e-9 for x in m["itl_s"])
    assert len(m["itl_s"]) == 2 and m["itl_s"][0] == m["itl_s"][1]
    assert all(s.duration_s > 0 for s in log.stats)


def _poor_acceptance_run(model, num_requests=4, max_tokens=120):
    """An engine whose synthetic drafts are never accepted (alpha 0), run to the end: several
    AcceptanceWatch windows close low. Returns the engine."""
    engine = tiny_engine(model, spec=SpecConfig(method="synthetic", alpha=0.0, num_speculative_tokens=4),
                         num_kv_blocks=256)
    for _ in range(num_requests):
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    engine.run_until_done()
    return engine


def _not_paying(caplog):
    return [r for r in caplog.records if r.name == "minispec" and "speculation is not paying" in r.getMessage()]


def test_low_acceptance_warning_logged_once_per_engine(tiny_model, caplog):
    caplog.set_level(logging.WARNING, logger="minispec")
    engine = _poor_acceptance_run(tiny_model)
    verifies = sum(r.num_verify_steps for r in engine.requests.values())
    watches = [o for o in engine._observers if isinstance(o, AcceptanceWatch)]
    assert len(watches) == 1  # the builder's: an observer of the engine, not the drafter guard's
    assert verifies >= 3 * watches[0].window  # several windows closed low, yet one warning
    assert len(_not_paying(caplog)) == 1
    assert _not_paying(caplog)[0].levelno == logging.WARNING
    _poor_acceptance_run(tiny_model)  # a second engine has its own watch: it warns once too
    assert len(_not_paying(caplog)) == 2


def test_low_acceptance_warning_silenced_by_logger_level(tiny_model, caplog):
    caplog.set_level(logging.WARNING)
    with quiet_engine_log():
        _poor_acceptance_run(tiny_model)
    assert _not_paying(caplog) == []
    assert logging.getLogger("minispec").level != logging.ERROR  # the level comes back afterwards


def test_acceptance_watch_warns_once_in_its_life():
    """A stretch that pays between two low ones used to re-arm the watch (a second warning from the
    same engine, as notebook 04 showed); now one watch, one engine, one warning."""
    watch = AcceptanceWatch(window=2, min_alpha=0.1)
    pays = SimpleNamespace(num_draft_proposed=4, num_draft_accepted=2)
    low = SimpleNamespace(num_draft_proposed=4, num_draft_accepted=0)
    assert all(watch.observe([pays]) is None for _ in range(20))
    messages = [watch.observe([out]) for out in [low] * 20 + [pays] * 20 + [low] * 20]
    warned = [m for m in messages if m is not None]
    assert len(warned) == 1 and "alpha 0.000" in warned[0]


def test_acceptance_watch_reads_alpha_from_runs_not_the_acceptance_rate():
    """Failed before the fix: the watch warned on accepted / proposed below 0.05, which falls with k
    by construction, and told a learner to turn off a draft that measured 1.21x at k 8. A draft whose
    every position passes with alpha 0.25 has an acceptance rate of 0.042 at k 8 (mean accepted length
    1.33), 0.22 at k 2; its run-based alpha is 0.25 at any k. One that passes 5% of positions warns."""
    import random

    def verifies(alpha, k, n=400, seed=1):
        rng = random.Random(seed)
        outs = []
        for _ in range(n):
            j = 0
            while j < k and rng.random() < alpha:
                j += 1
            outs.append(SimpleNamespace(num_draft_proposed=k, num_draft_accepted=j))
        return outs

    for k in (2, 8):
        watch = AcceptanceWatch()
        assert all(watch.observe([o]) is None for o in verifies(0.25, k)), k
    rate = sum(o.num_draft_accepted for o in verifies(0.25, 8)) / sum(o.num_draft_proposed for o in verifies(0.25, 8))
    assert rate < 0.05  # what the old watch warned on
    watch = AcceptanceWatch()
    warned = [m for m in (watch.observe([o]) for o in verifies(0.05, 8)) if m]
    assert len(warned) == 1 and "alpha 0.0" in warned[0]


def test_acceptance_watch_warns_on_tokens_per_unit_of_cost():
    """With a verify step's cost given (here 2.5 plain steps), a draft at alpha 0.6 and k 4 (mean
    accepted length 2.31) emits 0.92 of a plain step's tokens per unit of time: not paying; at a cost
    of 1.5 it pays (1.54)."""
    import random
    rng = random.Random(1)
    outs = []
    for _ in range(400):
        j = 0
        while j < 4 and rng.random() < 0.6:
            j += 1
        outs.append(SimpleNamespace(num_draft_proposed=4, num_draft_accepted=j))
    cheap, costly = AcceptanceWatch(cost=1.5), AcceptanceWatch(cost=2.5)
    assert all(cheap.observe([o]) is None for o in outs)
    warned = [m for m in (costly.observe([o]) for o in outs) if m]
    assert len(warned) == 1 and "costing 2.50 plain steps" in warned[0]
