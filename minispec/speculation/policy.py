"""When to speculate, and with how many draft tokens: one decision per step.

A policy sees the step's decoding requests and the engine's load, the requests it holds (running
and waiting, ``Scheduler.schedule``), and returns k per request (0 = decode plainly), or a
``DraftShape`` (a draft tree: depth, children per node, nodes). A policy built with a tree drafts
that tree whenever it chooses the full k, and a chain when it lowers k; a schedule can name a
tree per range ("1-2:4/4/8": depth 4, top 4, 8 nodes). The scheduler then clamps k to budget,
max_tokens and maximum length, and a request's own ``num_speculative_tokens`` overrides the
policy. Spec off costs nothing: k = 0 adds no verify position and no draft call. Policies here:
never, always, concurrency threshold with hysteresis, lane (interactive only), a batch-size -> k
schedule (like vLLM's dynamic speculative decoding, Liu et al. 2024 "Optimizing Speculative
Decoding for Serving LLMs Using Goodput").
Why the load counts waiting requests and the switches look back over a window of steps: a count
of the requests running dips whenever a closed loop's cohort finishes, for the step before the
next requests are admitted; a threshold reading it switches speculation on for a step or two, and
the draft model then catches up on whole prompts (the thrash notebook 07's failure-modes lab
shows, the bug class vLLM's batch-size -> k tables hit in 2026). ``count="decodes"`` keeps the
count that thrashes, for that lab. Taught in notebooks/07_policies.ipynb.
"""

from __future__ import annotations

from collections import deque

from minispec.core.request import Request
from minispec.base.tree_shape import DraftShape

LOAD_COUNTS = ("held", "decodes")


class SpecPolicy:
    """Base class: ``decide`` returns {request_id: k or DraftShape} for the decoding requests of a
    step. ``tree``: the draft tree used when the policy speculates with its full k (None: a chain)."""

    name = "base"

    def __init__(self, k: int, tree: DraftShape | None = None):
        self.k = k
        self.tree = tree if tree is not None and tree.is_tree else None

    def decide(self, decodes: list[Request], num_running: int) -> dict[str, int | DraftShape]:
        """{request_id: k or DraftShape} for ``decodes``, the requests decoding this step.
        ``num_running``: the load, the requests the engine holds (running and waiting; a name kept
        from before waiting requests counted, so policies written for it still run)."""
        k = self.choose_k(decodes, num_running)
        return {r.request_id: self.shape(self.k_for(r, k)) for r in decodes}

    def shape(self, k: int) -> int | DraftShape:
        """The policy's tree at its full k, else k (a chain)."""
        return self.tree if self.tree is not None and k == self.k else k

    def choose_k(self, decodes: list[Request], num_running: int) -> int:
        raise NotImplementedError

    def k_for(self, request: Request, k: int) -> int:
        return k

    def __repr__(self) -> str:
        return f"{type(self).__name__}(k={self.k})"


class NeverPolicy(SpecPolicy):
    name = "never"

    def choose_k(self, decodes, num_running):
        return 0


class AlwaysPolicy(SpecPolicy):
    name = "always"

    def choose_k(self, decodes, num_running):
        return self.k


class LoadWindow:
    """The load a policy switches on, and the largest load of its last ``window`` steps.

    ``count``: "held", the requests the engine holds (the load the scheduler passes), or
    "decodes", the requests decoding this step (a count that dips whenever a cohort finishes and
    its successors wait a step: notebook 07's thrash). ``window``: steps a switch towards more
    speculation waits for (1: it follows the last step's load alone).
    Raises: ValueError for an unknown count or a window below 1.
    """

    def __init__(self, window: int = 16, count: str = "held"):
        if count not in LOAD_COUNTS:
            raise ValueError(f"count={count!r}: choose one of {', '.join(LOAD_COUNTS)}")
        if window < 1:
            raise ValueError(f"window={window}: must be >= 1 step")
        self.window, self.count = window, count
        self.recent: deque[int] = deque(maxlen=window)

    def see(self, decodes: list[Request], num_running: int) -> int:
        """Record this step's load and return it."""
        load = len(decodes) if self.count == "decodes" else num_running
        self.recent.append(load)
        return load

    @property
    def peak(self) -> int:
        """The largest load of the last ``window`` steps (0 before the first)."""
        return max(self.recent, default=0)


class ThresholdPolicy(SpecPolicy):
    """Speculate while the load is at most N. Once off (load > N), it turns back on only when the
    load stayed at or below N - margin for ``window`` steps, so neither a load hovering around N
    nor a dip of a step or two flips it.

    Args: k; threshold: N; margin: default N // 4 (at least 1); tree: see SpecPolicy; window and
        count: see ``LoadWindow`` (window=1, count="decodes" is the rule that thrashes).
    Raises: ValueError for a negative threshold, a bad window or count.
    """

    name = "threshold"

    def __init__(self, k: int, threshold: int, margin: int | None = None, tree: DraftShape | None = None,
                 window: int = 16, count: str = "held"):
        super().__init__(k, tree)
        if threshold < 0:
            raise ValueError(f"threshold={threshold}: must be >= 0")
        self.threshold = threshold
        self.margin = max(1, threshold // 4) if margin is None else margin
        self.load = LoadWindow(window, count)
        self.active = True

    def choose_k(self, decodes, num_running):
        load = self.load.see(decodes, num_running)
        if self.active and load > self.threshold:
            self.active = False
        elif not self.active and self.load.peak <= self.threshold - self.margin:
            self.active = True
        return self.k if self.active else 0

    def __repr__(self) -> str:
        return (f"ThresholdPolicy(k={self.k}, threshold={self.threshold}, margin={self.margin}, "
                f"window={self.load.window}, count={self.load.count!r})")


class LanePolicy(SpecPolicy):
    """Only the interactive (premium) lane speculates; bulk traffic stays plain."""

    name = "lane"

    def choose_k(self, decodes, num_running):
        return self.k

    def k_for(self, request, k):
        return k if request.lane == "interactive" else 0


class SchedulePolicy(SpecPolicy):
    """k (or a draft tree) from the load: e.g. "1-4:4,5-16:2,17-:0", or "1-2:4/4/8,3-8:2,9-:0"
    for a tree of depth 4, top 4, 8 nodes at one or two requests. The range is read at the largest
    load of the last ``window`` steps (``LoadWindow``), so k falls at once when the load rises
    and grows again only once the load stayed low for the window."""

    name = "schedule"

    def __init__(self, k: int, ranges: list[tuple[int, int | None, int | DraftShape]], window: int = 16,
                 count: str = "held"):
        super().__init__(k)
        self.ranges = ranges
        self.load = LoadWindow(window, count)

    @classmethod
    def parse(cls, text: str, k: int, window: int = 16, count: str = "held") -> "SchedulePolicy":
        ranges = []
        for part in text.split(","):
            try:
                span, kk = part.split(":")
                lo, _, hi = span.partition("-")
                depth, *tree = (int(x) for x in kk.split("/"))
                if len(tree) not in (0, 2):
                    raise ValueError
                span = (int(lo), int(hi) if hi else None)
            except ValueError:
                raise ValueError(f"schedule part {part!r}: write LO-HI:K or LO-:K (K may be "
                                 "DEPTH/TOPK/NODES for a draft tree), e.g. 1-2:4/4/8,3-16:2,17-:0") from None
            ranges.append((*span, _schedule_shape(part, depth, tree)))
        return cls(k, ranges, window, count)

    def decide(self, decodes, num_running):
        shape = self.choose_k(decodes, num_running)
        return {r.request_id: shape for r in decodes}

    def choose_k(self, decodes, num_running):
        self.load.see(decodes, num_running)
        load = self.load.peak
        for lo, hi, kk in self.ranges:
            if load >= lo and (hi is None or load <= hi):
                return kk
        return 0

    def __repr__(self) -> str:
        return f"SchedulePolicy({self.ranges})"


def _schedule_shape(part: str, depth: int, tree: list[int]) -> int | DraftShape:
    """A schedule part's k, or its DEPTH/TOPK/NODES tree. Raises ValueError naming the part and
    what the shape can hold (``DraftShape``)."""
    if not tree:
        return depth
    try:
        return DraftShape(depth, tree[0], tree[1])
    except ValueError as exc:
        raise ValueError(f"schedule part {part!r}: {exc}") from None


POLICY_HELP = ("always | never | threshold:N | lane | schedule:1-4:4,5-16:2,17-:0 (K or DEPTH/TOPK/NODES) | "
               "auto | goodput")


# the policies that read no argument, and what to write instead of one
NO_ARGUMENT = {"always": "its k is num_speculative_tokens, --k", "never": "it never speculates",
               "lane": "the interactive lane speculates, bulk decodes plainly"}


def make_step_policy(text: str, k: int, tree: DraftShape | None = None) -> SpecPolicy:
    """Build a policy that needs no cost model from its CLI spelling (see ``POLICY_HELP``; the
    adaptive "auto" and "goodput" are built by ``minispec.build.speculation.make_policy``). ``tree``: the
    draft tree to use at the full k (a schedule names its own).

    Raises: ValueError for an unknown policy, a bad argument, or an argument given to a policy
    that reads none (always, never, lane: it would be dropped without a word).
    """
    name, colon, arg = text.partition(":")
    if name in NO_ARGUMENT and colon:
        raise ValueError(f"policy {text!r}: {name} takes no argument ({NO_ARGUMENT[name]}); write {name}")
    if name == "always":
        return AlwaysPolicy(k, tree)
    if name == "never":
        return NeverPolicy(k)
    if name == "lane":
        return LanePolicy(k, tree)
    if name == "threshold":
        try:
            threshold = int(arg)
        except ValueError:
            raise ValueError(f"policy {text!r}: write threshold:N with N an integer, "
                             "e.g. threshold:8") from None
        return ThresholdPolicy(k, threshold, tree=tree)
    if name == "schedule":
        return SchedulePolicy.parse(arg, k)
    raise ValueError(f"policy {text!r} is unknown: choose {POLICY_HELP}")
