"""Roofline cost of one engine step: weight bytes once, KV bytes per request, linear and attention FLOPs.

For a packed forward over requests i with q_i query tokens on top of c_i cached tokens and r_i
logit rows (docs/cost_model.md has the derivation and sources):
    FLOPs   = 2 N P_layers + 2 R E V_head + 4 L H D sum_i (q_i c_i + q_i (q_i + 1) / 2)
    bytes   = b_w (P_layers + E V_head) + b_w N E + kv_bytes_per_token sum_i (c_i + q_i)
    time    = max(compute, memory) + (1 - overlap) min(compute, memory) + fixed times
with N = sum q_i, R = sum r_i, compute = FLOPs / (peak_flops x eff), memory = bytes / (peak_bw x
eff). ``overlap`` 1 is the plain roofline; the GPU specs use 0 (the two add), as measured engines
do at serving batch sizes (docs/cost_model.md, sec. 2). Two more knobs exist for CPUs, where
``profile`` fits them: attention FLOPs run at ``attention_efficiency`` of the matmul rate, and
forwards of 2+ tokens read the weights ``1 + extra_weight_reads`` times. The fixed times are the
engine's: the target forward of a step pays ``step_overhead_s`` (once per engine step) and
``forward_overhead_s``, each draft forward ``draft_forward_overhead_s``, and every forward
``request_overhead_s`` per request, ``layer_overhead_s`` per layer (``eager_layer_overhead_s`` for a forward
holding a run too long to replay a CUDA graph) and, split over P GPUs, 2 L all-reduces (parallel.py). A draft
model's (or head's) k forwards are costed like the target's, one per step of the draft loop (Leviathan et al.
2023 call their cost ratio c). Roofline: Williams et al. 2009; its use for LLM decode: Pope et al. 2023
("Efficiently Scaling Transformer Inference"), sec. 2.
Invariant: the cost is a pure function of the batch's shape; it reads, never changes, the Batch.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

from minispec.models.config import ModelConfig
from minispec.cost.hardware import HardwareSpec, load_hardware
from minispec.cost.modelspec import ModelSpec
from minispec.cost.parallel import ACTIVATION_BYTES, allreduce_time_s, check_tensor_parallel, kv_split
from minispec.speculation.acceptance import expected_accepted_length, leviathan_speedup
from minispec.base.tree_shape import tree_inner_pairs

__all__ = ["CostModel", "StepCost", "attention_pairs", "batch_items", "expected_accepted_length", "item_sums",
           "leviathan_speedup", "max_query_of"]


def attention_pairs(q: float, c: float) -> float:
    """(query, key) pairs one request attends in a forward: q new tokens on top of c cached ones,
    each attending to the cache and causally to the new tokens before it: q c + q (q + 1) / 2."""
    return q * c + q * (q + 1) / 2


@dataclass
class StepCost:
    """The cost of one forward (or a sum of them). Times in seconds, FLOPs and bytes as counts."""

    time_s: float
    compute_s: float
    memory_s: float
    overhead_s: float
    flops: float
    bytes: float
    num_tokens: int
    num_requests: int

    @property
    def bound(self) -> str:
        """"compute" or "memory": which roofline term set the time."""
        return "compute" if self.compute_s > self.memory_s else "memory"


class _Coeffs:
    """Per-model constants of the formulas above for one of ``tp`` GPUs, computed once (the
    simulator calls them per step)."""

    def __init__(self, spec: ModelSpec, tp: int = 1):
        self.flops_per_token = 2.0 * spec.num_matmul_weights_per_token / tp
        self.flops_per_logit = 2.0 * spec.hidden_size * spec.num_lm_head_rows / tp
        self.flops_per_pair = 4.0 * spec.num_layers * spec.num_heads * spec.head_dim / tp
        self.weight_bytes = spec.weight_bytes_per_step / tp
        self.embed_bytes_per_token = spec.hidden_size * spec.bytes_per_weight
        self.kv_bytes_per_token = spec.kv_bytes_per_token * kv_split(tp, spec.num_kv_heads)
        self.num_allreduces = 2 * spec.num_layers if tp > 1 else 0  # after attention and after the MLP
        self.num_layers = spec.num_layers
        self.allreduce_bytes_per_token = spec.hidden_size * ACTIVATION_BYTES
        self.tp = tp


class CostModel:
    """Step times for a target (and optionally a draft model) on one device.

    Args:
        hardware: the device.
        target: the target model's shape and dtypes.
        draft: the draft model, or None when drafting is free (n-gram, synthetic).
        draft_kv_window: if set, the draft attends to at most this many recent tokens
            (a StreamingLLM-style sparse KV, as MagicDec's drafts do; Chen et al. 2024), so its KV
            reads stop growing with context. None = full KV.
        tensor_parallel_size: GPUs one target forward is split over (P); the times are one GPU's,
            all-reduces included (parallel.py).
        draft_tensor_parallel_size: the drafter's split; None = the target's (vLLM's default; its
            ``speculative_draft_tensor_parallel_size=1`` runs a small draft on one GPU).
    Raises: ValueError for a bad window or a split the hardware or model cannot take.
    """

    def __init__(self, hardware: HardwareSpec, target: ModelSpec, draft: ModelSpec | None = None,
                 draft_kv_window: int | None = None, tensor_parallel_size: int = 1,
                 draft_tensor_parallel_size: int | None = None):
        if draft_kv_window is not None and draft_kv_window < 1:
            raise ValueError(f"draft_kv_window={draft_kv_window}: must be None or >= 1 tokens")
        tp = tensor_parallel_size
        draft_tp = tp if draft_tensor_parallel_size is None else draft_tensor_parallel_size
        for spec, size in ((target, tp), (draft, draft_tp)):
            if spec is not None:
                check_tensor_parallel(size, hardware, spec.num_heads, spec.num_kv_heads, spec.name)
        self.hardware = hardware
        self.target = target
        self.draft = draft
        self.draft_kv_window = draft_kv_window
        self.tensor_parallel_size = tp
        self._inv_flops = 1.0 / hardware.effective_flops_per_s
        self._inv_attn_flops = self._inv_flops / hardware.attention_efficiency
        self._inv_bw = 1.0 / hardware.effective_bandwidth_bytes_per_s
        self._serial = 1.0 - hardware.overlap  # share of the shorter term that is not hidden
        self._extra_reads = hardware.extra_weight_reads
        self._target = _Coeffs(target, tp)
        self._draft = _Coeffs(draft, draft_tp) if draft is not None else None
        # fixed seconds of a forward: the target's carries the engine step's host work too
        self._fixed_target_s = hardware.step_overhead_s + hardware.forward_overhead_s
        self._fixed_draft_s = hardware.draft_overhead_s

    @classmethod
    def for_live_models(cls, target: ModelConfig, dtype: str, draft: ModelConfig | None = None,
                        hardware: str = "this") -> "CostModel":
        """The cost model the real engine's adaptive policies use: the live models' shapes stored in
        ``dtype`` ("float32", ...) on profiled hardware (default data/hardware/this.json).

        Raises: ValueError when ``hardware`` is not profiled (run ``python -m minispec profile``).
        """
        return cls(load_hardware(hardware), ModelSpec.of(target, dtype),
                   ModelSpec.of(draft, dtype) if draft is not None else None)

    def __repr__(self) -> str:
        draft = self.draft.name if self.draft else "free"
        tp = f", tp={self.tensor_parallel_size}" if self.tensor_parallel_size > 1 else ""
        return f"CostModel({self.hardware.name}, target={self.target.name}, draft={draft}{tp})"

    def _fixed_s(self, co: _Coeffs, num_tokens: int, num_requests: int,
                 draft: bool, max_query: int = 1) -> float:
        """The forward's fixed times: engine step (target only), forward, per layer (eager when a run
        of ``max_query`` tokens cannot replay a graph), per request, all-reduces."""
        hw = self.hardware
        per_request = hw.draft_request_overhead_s if draft and hw.draft_request_overhead_s is not None \
            else hw.request_overhead_s
        fixed = (self._fixed_draft_s if draft else self._fixed_target_s) + per_request * num_requests \
            + hw.layer_time_s(co.num_layers, max_query)
        if co.num_allreduces:
            fixed += co.num_allreduces * allreduce_time_s(self.hardware, co.tp,
                                                          num_tokens * co.allreduce_bytes_per_token)
        return fixed

    # -- one forward from aggregate sums -----------------------------------------------------
    def forward_cost(self, num_tokens: int, num_logits: int, num_pairs: float, num_kv_tokens: float,
                     num_requests: int, draft: bool = False, max_query: int = 1) -> StepCost:
        """Cost of one packed forward of the target (or the draft with ``draft=True``).

        Args:
            num_tokens: N, query tokens in the step.
            num_logits: R, rows that need logits (a verify needs k + 1, a mid-prompt chunk 0).
            num_pairs: sum over requests of (query, key) pairs attended, q c + q (q + 1) / 2.
            num_kv_tokens: sum over requests of context tokens whose K/V are read (c + q).
            num_requests: B, requests in the forward (for the per-request overhead).
            max_query: the longest run of one request in the forward (a prompt chunk longer than
                the hardware's ``graph_max_query`` makes the forward eager).
        Raises: ValueError when ``draft`` is asked for but the model has no draft.
        """
        co = self._coeffs(draft)
        linear = co.flops_per_token * num_tokens + co.flops_per_logit * num_logits
        attention = co.flops_per_pair * num_pairs
        weights = co.weight_bytes * (1.0 + self._extra_reads if num_tokens >= 2 else 1.0)
        nbytes = weights + co.embed_bytes_per_token * num_tokens + co.kv_bytes_per_token * num_kv_tokens
        compute_s = linear * self._inv_flops + attention * self._inv_attn_flops
        memory_s = nbytes * self._inv_bw
        overhead_s = self._fixed_s(co, num_tokens, num_requests, draft, max_query)
        time_s = max(compute_s, memory_s) + self._serial * min(compute_s, memory_s) + overhead_s
        return StepCost(time_s, compute_s, memory_s, overhead_s, linear + attention, nbytes, num_tokens,
                        num_requests)

    def forward_time_s(self, num_tokens: int, num_logits: int, num_pairs: float, num_kv_tokens: float,
                       num_requests: int, draft: bool = False, max_query: int = 1) -> float:
        """Seconds of one forward: :meth:`forward_cost` without building the record (hot path)."""
        co = self._draft if draft else self._target
        if co is None:
            return 0.0
        compute_s = (co.flops_per_token * num_tokens + co.flops_per_logit * num_logits) * self._inv_flops \
            + co.flops_per_pair * num_pairs * self._inv_attn_flops
        weights = co.weight_bytes * (1.0 + self._extra_reads if num_tokens >= 2 else 1.0)
        memory_s = (weights + co.embed_bytes_per_token * num_tokens + co.kv_bytes_per_token * num_kv_tokens) \
            * self._inv_bw
        if compute_s > memory_s:
            compute_s, memory_s = memory_s, compute_s  # now compute_s is the shorter term
        return (memory_s + self._serial * compute_s
                + self._fixed_s(co, num_tokens, num_requests, draft, max_query))

    def _coeffs(self, draft: bool) -> _Coeffs:
        if not draft:
            return self._target
        if self._draft is None:
            raise ValueError("this cost model has no draft model (drafting is free): pass draft=ModelSpec")
        return self._draft

    # -- from per-request runs ----------------------------------------------------------------
    def items_cost(self, items, draft: bool = False) -> StepCost:
        """Cost of a forward over ``items``: iterable of (q, c, r) = (query tokens, cached tokens
        before the step, logit rows) per request."""
        items = list(items)
        return self.forward_cost(*item_sums(items), draft=draft, max_query=max_query_of(items))

    def features(self, items) -> dict:
        """The raw quantities of a target forward over ``items`` (as in :meth:`items_cost`), split
        the way ``profile`` fits them: linear and attention FLOPs, weight bytes read once, other
        bytes (embedding rows, KV), tokens and requests."""
        n, r, pairs, kv, b = item_sums(items)
        co = self._target
        return {"linear_flops": co.flops_per_token * n + co.flops_per_logit * r,
                "attention_flops": co.flops_per_pair * pairs, "weight_bytes": co.weight_bytes,
                "other_bytes": co.embed_bytes_per_token * n + co.kv_bytes_per_token * kv,
                "num_tokens": n, "num_requests": b}

    def batch_cost(self, batch) -> StepCost:
        """The target forward of a scheduler's :class:`~minispec.core.batch.Batch` whose drafts are
        filled in: each request runs its own pending tokens plus its draft tokens."""
        return self.items_cost(batch_items(batch))

    def draft_time_s(self, pending: list[int], contexts: list[int], ks: list[int],
                     widths: list[list[int]] | None = None) -> float:
        """Seconds of a draft loop: forward j (j = 0..max k - 1) runs every request with k_i > j;
        forward 0 feeds the ``pending`` tokens the draft has not seen, later ones one token each
        (a chain), or for a draft tree the nodes of depth j it expands.

        Args:
            pending: per request, tokens the draft must catch up on (>= 1).
            contexts: per request, tokens already in the draft's KV cache.
            ks: per request, draft tokens to propose (a tree's depth).
            widths: per request, tokens of forward j for j = 1..k - 1 (a tree's expanded nodes
                per depth); None = one each (chains).
        Returns 0.0 when drafting is free.
        """
        if self._draft is None or not ks:
            return 0.0
        w = self.draft_kv_window
        total = 0.0
        for j in range(max(ks)):
            n = b = 0
            pairs = kv = 0.0
            longest = 1
            for i, (p, c, k) in enumerate(zip(pending, contexts, ks)):
                if k <= j:
                    continue
                width = 1 if widths is None or j == 0 else widths[i][j - 1]
                q, ctx = (p, c) if j == 0 else (width, c + p + j - 1)
                if w is not None:
                    ctx = min(ctx, w)
                n += q
                b += 1
                longest = max(longest, q)
                pairs += attention_pairs(q, ctx)
                kv += ctx + q
            total += self.forward_time_s(n, b, pairs, kv, b, draft=True, max_query=longest)
        return total

    def decode_step_time_s(self, contexts: list[int], ks: list[int]) -> float:
        """Estimated seconds of a step where request i (with contexts[i] cached tokens) decodes
        and verifies ks[i] draft tokens: the target forward plus the draft loop (a draft that is
        caught up, one pending token each). Used by the adaptive policies."""
        n = r = 0
        pairs = kv = 0.0
        for c, k in zip(contexts, ks):
            q = 1 + k
            n += q
            r += q
            pairs += attention_pairs(q, c)
            kv += c + q
        spec = [(c, k) for c, k in zip(contexts, ks) if k > 0]
        draft_s = self.draft_time_s([1] * len(spec), [c for c, _ in spec], [k for _, k in spec])
        return self.forward_time_s(n, r, pairs, kv, len(contexts), max_query=1 + max(ks, default=0)) + draft_s

    def increment_cost_s(self, context: int, j: int) -> float:
        """Marginal seconds of raising one request's k from j to j + 1 at ``context`` cached tokens,
        compute and memory terms added (a ranking proxy: one target verify position and one
        token of draft forward j; the shared weight reads are not included)."""
        t = self._target
        cost = (t.flops_per_token + t.flops_per_logit) * self._inv_flops \
            + t.flops_per_pair * (context + j + 2) * self._inv_attn_flops \
            + (t.embed_bytes_per_token + t.kv_bytes_per_token) * self._inv_bw \
            + self.hardware.request_overhead_s
        d = self._draft
        if d is not None:
            ctx = context + j if self.draft_kv_window is None else min(context + j, self.draft_kv_window)
            cost += (d.flops_per_token + d.flops_per_logit) * self._inv_flops \
                + d.flops_per_pair * (ctx + 1) * self._inv_attn_flops \
                + (d.embed_bytes_per_token + d.kv_bytes_per_token * (ctx + 1)) * self._inv_bw \
                + self.hardware.request_overhead_s
        return cost

    def draft_catch_up_s(self, pending: int, context: int) -> float:
        """Extra seconds for the draft model to run ``pending`` unseen tokens on top of ``context``
        (its compute; the weights are read by the draft forward anyway). 0 when drafting is free."""
        d = self._draft
        if d is None or pending <= 1:
            return 0.0
        ctx = context if self.draft_kv_window is None else min(context, self.draft_kv_window)
        return d.flops_per_token * pending * self._inv_flops \
            + d.flops_per_pair * attention_pairs(pending, ctx) * self._inv_attn_flops

    def uniform_decode_time_s(self, num_requests: int, context: float, k: int) -> float:
        """:meth:`decode_step_time_s` for ``num_requests`` alike requests (closed form, O(k))."""
        b, q, c = num_requests, 1 + k, context
        target_s = self.forward_time_s(b * q, b * q, b * attention_pairs(q, c), b * (c + q), b, max_query=q)
        if k == 0 or self._draft is None:
            return target_s
        w = self.draft_kv_window
        draft_s = 0.0
        for j in range(k):
            ctx = c + j if w is None else min(c + j, w)
            draft_s += self.forward_time_s(b, b, b * (ctx + 1), b * (ctx + 1), b, draft=True)
        return target_s + draft_s

    def uniform_rate(self, n: int, context: float,
                     k: int, alpha: float, workload: dict | None = None) -> float:
        """Expected tokens/s of steps where ``n`` alike requests (``context`` cached tokens each)
        decode and verify k drafts, with the same prefill share and draft catch-up as the goodput
        policy (minispec/speculation/adaptive.py).

        workload: optional dict with ``rho`` (prompt tokens per output token), ``prompt_len``,
        ``output_len`` and ``clump`` (prompt tokens arriving together); None means decode alone.
        """
        w = workload or {}
        e = expected_accepted_length(alpha, k)
        q = 1 + k
        n_tok, pairs, kv = n * q, n * attention_pairs(q, context), n * (context + q)
        pre_n = w.get("rho", 0.0) * n * e
        alone = self.forward_time_s(n_tok, n_tok, pairs, kv, n, max_query=q)
        target_s = alone
        if pre_n > 0:
            f = min(1.0, pre_n / max(1.0, w.get("clump") or w.get("prompt_len", 1)))
            pre_pairs = pre_n * w.get("prompt_len", 0) / 2
            target_s = f * self.forward_time_s(n_tok + pre_n / f, n_tok, pairs + pre_pairs / f,
                                               kv + pre_n / f, n, max_query=int(max(q, pre_n / f))) \
                + (1.0 - f) * alone
        draft_s = self.uniform_decode_time_s(n, context, k) - alone  # the draft loop of k forwards
        if k and self.draft is not None and w.get("output_len"):
            share = min(1.0, 2.0 * e / w["output_len"])  # a request has output_len / 2 tokens left on average
            draft_s += n * share * self.draft_catch_up_s(int(w.get("prompt_len", 0)), 0)
        return n * e / (target_s + draft_s)

    def speedup(self, num_requests: int, context: float, k: int, alpha: float) -> float:
        """Expected decode throughput with k drafts over plain decoding, for alike requests:
        E(alpha, k) x T_plain / T_spec (Leviathan et al. 2023's factor, with batch-aware times)."""
        plain = self.uniform_decode_time_s(num_requests, context, 0)
        return (expected_accepted_length(alpha, k) * plain
                / self.uniform_decode_time_s(num_requests, context, k))


def batch_items(batch):
    """(q, c, r, inner) per scheduled request of a Batch: query tokens (own + drafts), cached
    tokens before the step, logit rows (1 + drafts when the request samples, else 0), and the
    attention pairs among the step's own tokens (q (q + 1) / 2 for a causal run; less for a tree)."""
    items = []
    for s in batch.scheduled:
        q = s.num_query_tokens
        inner = (q * (q + 1) / 2 if s.draft_parents is None
                 else tree_inner_pairs(s.num_own_tokens, s.draft_parents))
        items.append((q, s.request.num_computed_tokens,
                      1 + len(s.draft_token_ids) if s.samples else 0, inner))
    return items


def max_query_of(items) -> int:
    """The longest run of one request among (q, c, r[, inner]) items (1 for none)."""
    return max((item[0] for item in items), default=1)


def item_sums(items) -> tuple[int, int, float, float, int]:
    """Sums over (q, c, r[, inner]) per request: tokens N, logit rows, attention (query, key) pairs
    (sum of q c + inner, inner = q (q + 1) / 2 unless given), KV tokens read (sum of c + q), and
    requests B."""
    n = rows = b = 0
    pairs = kv = 0.0
    for item in items:
        q, c, r = item[0], item[1], item[2]
        n, rows, b = n + q, rows + r, b + 1
        pairs += q * c + (item[3] if len(item) > 3 else q * (q + 1) / 2)
        kv += c + q
    return n, rows, pairs, kv, b
