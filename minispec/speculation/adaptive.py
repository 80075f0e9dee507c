"""Adaptive speculation policies driven by a cost model and the live acceptance estimate.

- ``GoodputPolicy`` ("goodput"): each step, a k per request (0 = none) that maximises expected
  generated tokens per second, sum_i E(alpha_i, k_i) / T(k_1..k_B), with E the expected accepted
  length and T the cost model's step time (target forward plus the draft loop). In the spirit of
  SmartSpec (Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language Models
  Using Goodput", sec. 4; their goodput is this token rate, not the SLO goodput of metrics.py).
- ``AutoThresholdPolicy`` ("auto"): a concurrency threshold with hysteresis, placed where the cost
  model says speculation stops paying: the largest batch whose expected speedup is >= 1.
Both estimate alpha from the requests' own counters through an ``AcceptanceEstimate`` and ``Probe`` now and
then while they say no (speculation/estimate.py), so they work unchanged in the real engine and in the
simulator.
Invariant: a policy only returns k values; the scheduler still clamps them to budget, max_tokens and maximum
length. The cost model (``minispec.cost.model.CostModel``) is handed in by whoever builds the policy: spec
sits below the simulator and never imports it. Taught in notebooks/08_json_routes.ipynb.
"""

from __future__ import annotations

from minispec.core.request import Request
from minispec.speculation.acceptance import expected_accepted_length, expected_tree_length
from minispec.speculation.estimate import AcceptanceEstimate, Probe, parse_prior
from minispec.speculation.policy import SpecPolicy, ThresholdPolicy
from minispec.base.tree_shape import DraftShape, canonical_tree, expanded_widths, tree_inner_pairs

ADAPTIVE_POLICIES = ("auto", "goodput")


class GoodputPolicy(SpecPolicy):
    """Per-request k maximising expected tokens per second (SmartSpec-style), up to ``k`` each;
    a few requests planned at k = 0 draft on one step in ``probe_every`` (``Probe``).

    The search: every increment "request i from j to j + 1 drafts" gains alpha_i^(j+1) expected
    tokens at a marginal cost (its verify position, its draft forward, and for j = 0 the draft
    catching up on the tokens it has not seen, spread over the request's remaining output).
    Increments are taken in order of gain per cost and the best prefix is kept, so uniform choices
    (everyone k = 0, 1, ..., K) are among the candidates and cheap, likely drafts go first.
    Prefill chunks share steps but are not shown to a policy, so T includes the steady-state share:
    each token request i emits brings P_i / max_tokens_i prompt tokens of prefill (a finished
    request is replaced by a new prompt). Prompts arrive in clumps, not evenly, so that work is
    placed in a fraction f of the steps, in clumps of the size seen lately (the prompt tokens of
    requests that newly started decoding): T = f T(decode + clump) + (1 - f) T(decode). Verify
    positions are nearly free in a memory-bound decode step and cost full compute in a step that a
    prompt has made compute-bound; the mixture prices both.
    With a draft ``tree`` (a DraftShape), the plan is set beside one more candidate: every request
    drafts the tree, priced the same way (its N + 1 verify rows per request, the tree's attention,
    the draft loop's wider forwards) and credited with its expected length under the top-c
    agreement model (``expected_tree_length``); whichever rate is higher is what the step drafts.
    The live alpha is estimated from chains and trees alike (a tree's accepted path counts as a
    chain's), which flatters a chain after tree steps: the comparison is a guide, not an optimum.
    """

    name = "goodput"

    def __init__(self, k: int, cost_model, estimate: AcceptanceEstimate | None = None, probe_every: int = 32,
                 tree: DraftShape | None = None):
        super().__init__(k, tree)
        self.cost_model = cost_model
        self.estimate = estimate or AcceptanceEstimate()
        self.probe = Probe(k, probe_every)
        self._draft_seen: dict[str, tuple[Request, int]] = {}  # tokens the draft model has seen
        self._decoding: dict[str, Request] = {}  # requests seen decoding
        self.prefill_clump_tokens: float | None = None  # prompt tokens arriving together, lately
        self._steps = 0

    def decide(self, decodes: list[Request], num_running: int) -> dict[str, int]:
        if not decodes:
            return {}
        self.estimate.observe(decodes)
        self._observe_clumps(decodes)
        pool = self.estimate.alpha
        alphas = [self.estimate.for_request(r, pool) for r in decodes]
        catch_up = None
        if self.cost_model.draft is not None:
            seen = self._draft_seen
            catch_up = []
            for r, a in zip(decodes, alphas):
                done = seen[r.request_id][1] if r.request_id in seen else 0
                left = max(1, r.sampling_params.max_tokens - r.num_output_tokens)
                share = min(1.0, expected_accepted_length(a, self.k) / left)
                catch_up.append(share * self.cost_model.draft_catch_up_s(r.num_tokens - done, done))
        prompts = [(r.num_prompt_tokens / r.sampling_params.max_tokens, r.num_prompt_tokens) for r in decodes]
        contexts = [r.num_computed_tokens for r in decodes]
        ks = self.plan(contexts, alphas, catch_up, prompts, self.prefill_clump_tokens)
        if self.tree is not None and self.tree_rate(contexts, alphas, catch_up, prompts,
                                                    self.prefill_clump_tokens) > self.last_rate:
            self._steps += 1
            return {r.request_id: self.tree for r in decodes}
        ks = self.probe.apply(decodes, {r.request_id: kk for r, kk in zip(decodes, ks)})
        if catch_up is not None:
            for r in decodes:
                if ks[r.request_id]:
                    self._draft_seen[r.request_id] = (r, r.num_tokens + ks[r.request_id] - 1)
        self._steps += 1
        if self._steps % 256 == 0:  # forget finished requests
            self._draft_seen = {rid: v for rid, v in self._draft_seen.items() if not v[0].finished}
            self._decoding = {rid: r for rid, r in self._decoding.items() if not r.finished}
        return ks

    def _observe_clumps(self, decodes: list[Request], keep: float = 0.8) -> None:
        """Average prompt tokens of the requests that start decoding together (one clump)."""
        clump = 0
        for r in decodes:
            if r.request_id not in self._decoding:
                self._decoding[r.request_id] = r
                clump += r.num_prompt_tokens
        if clump:
            old = self.prefill_clump_tokens
            self.prefill_clump_tokens = clump if old is None else keep * old + (1 - keep) * clump

    def plan(self, contexts: list[int], alphas: list[float], catch_up_s: list[float] | None = None,
             prompts: list[tuple[float, int]] | None = None, clump_tokens: float | None = None) -> list[int]:
        """k per request maximising sum E(alpha_i, k_i) / T for requests with ``contexts`` cached
        tokens; ``catch_up_s``: extra draft seconds charged when request i starts drafting;
        ``prompts``: per request (prompt tokens per output token, prompt length), the prefill
        each emitted token brings (None: no prefill); ``clump_tokens``: prompt tokens that land in
        one step together (None: one mean prompt). Returns ints in 0..k.

        Each draft level j (the j-th draft forward) has a fixed cost, its weight read, shared by
        every request drafting that deep; so for each depth L = 1..k the increments with j < L are
        walked in order of gain per marginal cost, and the best prefix over all walks wins.
        """
        cm, big_k, b = self.cost_model, self.k, len(contexts)
        catch_up_s = catch_up_s or [0.0] * b
        order = []
        for i in range(b):
            a = alphas[i]
            if a <= 0:
                continue
            key = float("inf")
            for j in range(big_k):
                cost = cm.increment_cost_s(contexts[i], j) + (catch_up_s[i] if j == 0 else 0.0)
                key = min(key, a ** (j + 1) / cost)  # keeps each request's increments in j order
                order.append((key, j, i))
        order.sort(key=lambda t: (-t[0], t[1]))
        prompts = prompts or [(0.0, 0)] * b
        clump = clump_tokens or max(1.0, sum(length for _, length in prompts) / b)
        pre_n = sum(rho for rho, _ in prompts)  # one emitted token each brings rho prompt tokens
        pre_pairs = sum(rho * length / 2 for rho, length in prompts)
        ctx = float(sum(contexts) + b)
        best_rate, best_incs = b / self._mixed_time(b, b, ctx, ctx, b, pre_n, pre_pairs, clump), []
        for depth in range(1, big_k + 1):
            walk = [t for t in order if t[1] < depth]
            rate, length = self._best_prefix(walk, contexts, alphas, catch_up_s, prompts, pre_n,
                                             pre_pairs, clump)
            if rate > best_rate:
                best_rate, best_incs = rate, walk[:length]
        ks = [0] * b
        for _, j, i in best_incs:
            ks[i] = max(ks[i], j + 1)
        self.last_rate = best_rate
        return ks

    def tree_rate(self, contexts: list[int], alphas: list[float], catch_up_s: list[float] | None = None,
                  prompts: list[tuple[float, int]] | None = None, clump_tokens: float | None = None) -> float:
        """Expected tokens/s of a step in which every request drafts ``self.tree`` (priced as
        :meth:`plan` prices chains; the tree's shape is ``canonical_tree``)."""
        cm, b, tree = self.cost_model, len(contexts), self.tree
        parents = canonical_tree(tree.num_speculative_tokens, tree.draft_topk, tree.num_draft_tokens)
        q, inner = 1 + len(parents), tree_inner_pairs(1, parents)
        widths = expanded_widths(parents, tree.num_speculative_tokens, tree.draft_topk)
        prompts = prompts or [(0.0, 0)] * b
        tokens = pre_n = pre_pairs = 0.0
        for a, (rho, length) in zip(alphas, prompts):
            e = expected_tree_length(a, parents)
            tokens += e
            pre_n += rho * e
            pre_pairs += rho * e * length / 2
        clump = clump_tokens or max(1.0, sum(length for _, length in prompts) / b)
        pairs = sum(q * c + inner for c in contexts)
        kv = float(sum(contexts) + q * b)
        target_s = self._mixed_time(q * b, q * b, pairs, kv, b, pre_n, pre_pairs, clump)
        draft_s = (cm.draft_time_s([1] * b, contexts, [tree.num_speculative_tokens] * b, [widths] * b)
                   + sum(catch_up_s or []))
        return tokens / (target_s + draft_s)

    def _mixed_time(self, n, r, pairs, kv, b, pre_n, pre_pairs, clump) -> float:
        """Target forward seconds with the prefill share pre_n placed in clumps: a fraction
        f = pre_n / clump of the steps carries a clump, the rest decode alone."""
        cm = self.cost_model
        alone = cm.forward_time_s(n, r, pairs, kv, b)
        if pre_n <= 0:
            return alone
        f = min(1.0, pre_n / clump)
        with_prompt = cm.forward_time_s(n + pre_n / f, r, pairs + pre_pairs / f, kv + pre_n / f, b)
        return f * with_prompt + (1.0 - f) * alone

    def _best_prefix(self, walk, contexts, alphas, catch_up_s, prompts,
                     pre_n, pre_pairs, clump) -> tuple[float, int]:
        """Apply the increments of ``walk`` one by one; return (best tokens/s, its prefix length)."""
        cm, b = self.cost_model, len(contexts)
        window = cm.draft_kv_window
        n = r = b
        pairs = kv = float(sum(contexts) + b)
        level_n = [0] * self.k
        level_pairs = [0.0] * self.k
        level_s = [0.0] * self.k
        draft_s = 0.0
        tokens = float(b)
        best_rate, best_len = 0.0, 0
        for step, (_, j, i) in enumerate(walk, 1):
            c = contexts[i]
            n += 1
            r += 1
            pairs += c + j + 2
            kv += 1
            ctx = c + j if window is None else min(c + j, window)
            level_n[j] += 1
            level_pairs[j] += ctx + 1
            new_level = cm.forward_time_s(level_n[j], level_n[j], level_pairs[j], level_pairs[j], level_n[j],
                                          draft=True)
            draft_s += new_level - level_s[j] + (catch_up_s[i] if j == 0 else 0.0)
            level_s[j] = new_level
            gain = alphas[i] ** (j + 1)
            tokens += gain
            rho, length = prompts[i]
            pre_n += rho * gain
            pre_pairs += rho * gain * length / 2
            rate = tokens / (self._mixed_time(n, r, pairs, kv, b, pre_n, pre_pairs, clump) + draft_s)
            if rate > best_rate:
                best_rate, best_len = rate, step
        return best_rate, best_len

    def __repr__(self) -> str:
        return f"GoodputPolicy(k<={self.k}, {self.cost_model})"


class AutoThresholdPolicy(ThresholdPolicy):
    """Speculate with k while running requests <= the cost model's break-even batch size (and
    ``Probe`` now and then while above it).

    The threshold is the largest batch n whose expected speedup rate(k) / rate(0) (see
    ``CostModel.uniform_rate``: the decode step, its share of prefill, the draft loop and the draft's
    catch-up) is >= 1 at the live acceptance and the decodes' mean context, prompt and output
    lengths; it is recomputed when they move, and ThresholdPolicy's hysteresis keeps a load near it
    from flapping.
    """

    name = "auto"

    def __init__(self, k: int, cost_model, estimate: AcceptanceEstimate | None = None,
                 max_batch: int = 4096, probe_every: int = 32):
        super().__init__(k, threshold=max_batch)
        self.cost_model = cost_model
        self.estimate = estimate or AcceptanceEstimate()
        self.probe = Probe(k, probe_every)
        self.max_batch = max_batch
        self._key = None
        self._seen: set[str] = set()
        self._clump: float | None = None

    def decide(self, decodes, num_running):
        if decodes:
            self.estimate.observe(decodes)
            b = len(decodes)
            clump = sum(r.num_prompt_tokens for r in decodes if r.request_id not in self._seen)
            if clump:  # prompt tokens of requests that started decoding together
                self._seen.update(r.request_id for r in decodes)
                self._clump = clump if self._clump is None else 0.8 * self._clump + 0.2 * clump
            if len(self._seen) > 16 * self.max_batch:
                self._seen = {r.request_id for r in decodes}
            context = sum(r.num_computed_tokens for r in decodes) / b
            prompt_len = sum(r.num_prompt_tokens for r in decodes) / b
            output_len = sum(r.sampling_params.max_tokens for r in decodes) / b
            workload = {"rho": prompt_len / output_len, "prompt_len": prompt_len, "output_len": output_len,
                        "clump": self._clump}
            key = (round(self.estimate.alpha, 2), round(context, -1 if context < 1000 else -2),
                   round(prompt_len, -1), round(output_len, -1), round(self._clump or 0, -2))
            if key != self._key:
                self._key = key
                self.threshold = self.break_even(self.estimate.alpha, context, workload)
                # a break-even below 4 leaves no room for hysteresis: a margin of 1 would keep a
                # threshold of 1 off for good once a probe has moved it up from 0
                self.margin = self.threshold // 4
        return self.probe.apply(decodes, super().decide(decodes, num_running))

    def break_even(self, alpha: float, context: float, workload: dict | None = None) -> int:
        """Largest batch size (0..max_batch) at which speculation with k still pays (speedup >= 1)."""
        cm, k = self.cost_model, self.k

        def pays(n: int) -> bool:
            return (cm.uniform_rate(n, context, k, alpha, workload)
                    >= cm.uniform_rate(n, context, 0, alpha, workload))

        if not pays(1):
            return 0
        if pays(self.max_batch):
            return self.max_batch
        lo, hi = 1, self.max_batch  # pays(lo), not pays(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if pays(mid):
                lo = mid
            else:
                hi = mid
        return lo

    def __repr__(self) -> str:
        return f"AutoThresholdPolicy(k={self.k}, threshold={self.threshold}, {self.cost_model})"


def make_adaptive_policy(name: str, k: int, arg: str,
                         cost_model, tree: DraftShape | None = None) -> SpecPolicy:
    """Build "goodput" or "auto" (``arg``: optional prior alpha, e.g. "goodput:0.7").

    Raises:
        ValueError: for another name, a bad prior, or no cost model (the real engine builds one
            from the profiled ``this`` hardware, see ``CostModel.for_live_models``).
    """
    if cost_model is None:
        raise ValueError(f"policy {name!r} needs a cost model: the simulator passes its own; the real engine "
                         "uses data/hardware/this.json, written by `python -m minispec profile`")
    estimate = AcceptanceEstimate(prior=parse_prior(arg, name))
    if name == "goodput":
        return GoodputPolicy(k, cost_model, estimate, tree=tree)
    if name == "auto":
        return AutoThresholdPolicy(k, cost_model, estimate)
    raise ValueError(f"adaptive policy {name!r} is unknown: choose goodput or auto")
