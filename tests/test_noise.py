"""course.noise: interleaved rounds rotate the order; a verdict is a finding only when
every round agrees beyond the dead zone."""

import pytest

from course.noise import compare, interleaved_rounds, median_time_s


def test_rounds_rotate_the_order_so_drift_hits_every_arm_alike():
    calls = []
    arms = {n: (lambda n=n: calls.append(n) or len(calls)) for n in ("off", "ngram", "draft")}
    out = interleaved_rounds(arms, rounds=3)
    assert calls == ["off", "ngram", "draft", "ngram", "draft", "off", "draft", "off", "ngram"]
    assert out["off"] == [1.0, 6.0, 8.0] and out["draft"] == [3.0, 5.0, 7.0]
    with pytest.raises(ValueError, match="rounds=0"):
        interleaved_rounds(arms, rounds=0)


@pytest.mark.parametrize("arm,finding", [
    ([1.3, 1.2, 1.25], "higher"),      # every round clears the 5% band
    ([0.8, 0.9, 0.85], "lower"),
    ([1.02, 0.99, 1.04], "tie"),       # every round inside the band
    ([1.3, 0.97, 1.2], "noisy"),       # a round below 1.0: the rounds disagree on the direction
    ([1.3, 0.8, 1.2], "noisy"),        # rounds disagree on the direction
    ([0.94, 0.91, 0.95], "probably lower"),   # every round below 1, one inside the band (05 cell 4's case)
    ([1.2, 1.03, 1.1], "probably higher"),
])
def test_a_verdict_needs_every_round_to_agree(arm, finding):
    v = compare(arm, [1.0] * 3)
    assert v.finding == finding
    assert v.low == min(arm) and v.high == max(arm) and v.ratio == sorted(arm)[1]
    assert ("too noisy to tell" in v.text()) == (finding == "noisy")
    assert v.clear == (finding in ("higher", "lower"))


def test_ratios_pair_rounds_not_means():
    # the baseline drifts 2x between rounds (a background job): paired ratios still agree
    v = compare([2.2, 1.1], [2.0, 1.0])
    assert v.finding == "higher" and v.ratio == pytest.approx(1.1)
    with pytest.raises(ValueError, match="equal length"):
        compare([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        compare([1.0], [0.0])


def test_median_time_ignores_one_slow_call():
    delays = iter([0.0, 0.0, 0.05, 0.0, 0.0])
    import time
    assert median_time_s(lambda: time.sleep(next(delays)), repeats=5) < 0.02


def test_one_sided_verdicts_say_probably_and_never_claim_disagreement():
    """Rounds that all point one way but not all beyond the dead zone are "probably", not "too noisy
    ... the rounds disagree" (issue 37: a false reason printed for 0.94x, 0.91-0.95)."""
    v = compare([0.94, 0.91, 0.95], [1.0, 1.0, 1.0])
    assert v.finding == "probably lower" and not v.clear
    assert v.text().startswith("probably slower") and "disagree" not in v.text()
    assert "disagree on the direction" in compare([1.1, 0.9, 1.0], [1.0] * 3).text()


def test_ratios_are_taken_against_the_median_baseline_round():
    """Against the median of the baseline's rounds, not its slowest one (04 cell 9 picked 1.40x
    against the slowest spec-off run; against the median it was about 1.24x)."""
    from course.noise import ratios_to_median
    assert ratios_to_median([14.0, 12.4], [10.0, 11.3, 12.0]) == pytest.approx([14.0 / 11.3, 12.4 / 11.3])
    with pytest.raises(ValueError, match="baseline"):
        ratios_to_median([1.0], [])


def test_a_ranking_names_a_winner_only_where_the_rounds_settle_it():
    from course.noise import rank
    settled = rank({"a": [2.0, 2.1, 2.2], "b": [1.0, 1.1, 1.05], "c": [1.02, 1.08, 1.0]})
    assert settled.order[0] == "a" and settled.winner == "a"
    assert settled.settled == [True, False]  # b and c overlap: not settled
    assert "not settled on this run" in settled.text() and "a ahead of" in settled.text()
    close = rank({"fast": [1.0, 1.2, 1.1], "slow": [1.05, 1.0, 1.08]})
    assert close.winner is None and "not settled" in close.text()
    times = rank({"x": [0.7, 0.8, 0.75], "y": [1.0, 1.1, 1.05]}, higher_is_better=False)
    assert times.order == ["x", "y"] and times.winner == "x"


def test_one_round_is_no_finding_and_never_claims_the_rounds_disagree():
    """A single round has no spread: however large its ratio, it is "one round", not a finding, and
    not "the rounds disagree" (09 in fast mode ran one round and printed that false reason)."""
    from course.noise import rank
    for ratio in (2.0, 1.0, 0.5):
        v = compare([ratio], [1.0])
        assert v.finding == "one round" and not v.clear
        assert "one round" in v.text() and "disagree" not in v.text()
    one = rank({"a": [3.0], "b": [1.0]})
    assert one.order == ["a", "b"] and one.winner is None and one.settled == [False]
