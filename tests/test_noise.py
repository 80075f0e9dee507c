"""minispec.course.noise: interleaved rounds rotate the order; a verdict is a finding only when
every round agrees beyond the dead zone."""

import pytest

from minispec.course.noise import compare, interleaved_rounds, median_time_s


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
    ([1.3, 0.97, 1.2], "noisy"),       # a round inside the band: the spread covers the effect
    ([1.3, 0.8, 1.2], "noisy"),        # rounds disagree on the direction
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
