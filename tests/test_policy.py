"""When to speculate (minispec/speculation/policy.py, minispec/build/speculation.py's make_policy): each policy
switches exactly as specified, the threshold policy's hysteresis and look-back window, what a
policy counts as load, and the policy names refused with a reason."""

import pytest

from minispec.build.speculation import make_policy
from minispec.speculation.policy import AlwaysPolicy, LanePolicy, NeverPolicy, SchedulePolicy, ThresholdPolicy


class R:
    def __init__(self, rid, lane="interactive"):
        self.request_id, self.lane = rid, lane


def test_policies_switch_exactly_as_specified():
    reqs = [R("a"), R("b", "bulk")]
    assert NeverPolicy(4).decide(reqs, 1) == {"a": 0, "b": 0}
    assert AlwaysPolicy(3).decide(reqs, 100) == {"a": 3, "b": 3}
    assert LanePolicy(4).decide(reqs, 2) == {"a": 4, "b": 0}
    sched = SchedulePolicy.parse("1-4:4,5-16:2,17-:0", 4)
    assert [sched.choose_k([], n) for n in (1, 4, 5, 16, 17, 500)] == [4, 4, 2, 2, 0, 0]


def test_threshold_policy_has_hysteresis():
    p = ThresholdPolicy(4, threshold=8, margin=2, window=1)
    loads = [1, 8, 9, 8, 7, 6, 7, 8, 9, 20, 6]
    ks = [p.choose_k([], n) for n in loads]
    # on up to 8; off above 8; back on only at <= 6; a load wobbling 7-8 does not flip it
    assert ks == [4, 4, 0, 0, 0, 4, 4, 4, 0, 0, 4]


def test_threshold_policy_turns_back_on_only_after_a_window_of_low_load():
    """Failed before the window (issue 34): one step at or below N - margin switched speculation
    back on, so a load that dips for a step (a cohort finishing) made the draft catch up on whole
    prompts for a step or two of drafting."""
    p = ThresholdPolicy(4, threshold=8, margin=2, window=4)
    ks = [p.choose_k([], n) for n in [20, 6, 20, 6, 6, 6, 6, 6]]
    assert ks == [0, 0, 0, 0, 0, 0, 4, 4]  # back on once four steps in a row stayed at or below 6
    assert ThresholdPolicy(4, 8).load.window == 16


def test_threshold_policy_counts_what_it_is_told_to():
    decodes = [R("a"), R("b"), R("c")]
    held, naive = ThresholdPolicy(4, 2, window=1), ThresholdPolicy(4, 2, window=1, count="decodes")
    assert held.choose_k(decodes, 1) == 4 and naive.choose_k(decodes, 1) == 0   # the load given, or the decodes
    assert ThresholdPolicy(4, 2, window=1).choose_k(decodes[:1], 40) == 0        # forty held: off
    with pytest.raises(ValueError, match="count='running'"):
        ThresholdPolicy(4, 2, count="running")
    with pytest.raises(ValueError, match="window=0"):
        ThresholdPolicy(4, 2, window=0)


def test_schedule_policy_reads_the_largest_load_of_its_window():
    sched = SchedulePolicy.parse("1-4:4,5-16:2,17-:0", 4)
    sched.load = type(sched.load)(window=3)
    assert [sched.choose_k([], n) for n in (2, 20, 2, 2, 2, 8)] == [4, 0, 0, 0, 4, 2]


def test_make_policy_parses_and_rejects():
    assert isinstance(make_policy("threshold:8", 4), ThresholdPolicy)
    assert isinstance(make_policy("schedule:1-4:4,5-:0", 4), SchedulePolicy)
    with pytest.raises(ValueError, match="policy 'sometimes' is unknown"):
        make_policy("sometimes", 4)
    with pytest.raises(ValueError, match="threshold:N"):
        make_policy("threshold:many", 4)
    with pytest.raises(ValueError, match="schedule part"):
        make_policy("schedule:1to4", 4)
    # issue 41, item 5: a policy that reads no argument refuses one instead of dropping it
    for text in ("always:3", "never:2", "lane:bulk", "always:"):
        with pytest.raises(ValueError, match=rf"policy '{text}': {text.split(':')[0]} takes no argument"):
            make_policy(text, 4)
