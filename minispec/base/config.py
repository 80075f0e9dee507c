"""Validated configuration dataclasses for the engine, its scheduler and speculation.

Invariant: a config object that exists is valid. Every check lives in ``__post_init__`` and
raises ``ValueError`` naming the bad value and what is allowed, so a mistake surfaces when the
engine is built, not three steps into a run. Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minispec.models.kernels import KERNELS, WEIGHT_FORMATS
from minispec.base.checks import is_int, is_number
from minispec.base.tree_shape import DraftShape, max_tree_nodes

SPEC_METHODS = ("off", "ngram", "draft", "synthetic")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class SchedulerConfig:
    """How the scheduler packs each step (Yu et al. 2022, Orca, iteration-level scheduling).

    Args:
        max_num_batched_tokens: token budget per step: prefill chunk tokens + decode tokens +
            verify positions never exceed it.
        max_num_seqs: most requests running (holding KV blocks) at once.
        enable_chunked_prefill: split long prompts over several steps so decodes keep flowing
            (Agrawal et al. 2024, Sarathi-Serve). When off, a prompt is prefilled in one step, so
            the budget must be at least the model's maximum length.
    """

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        _check(isinstance(self.max_num_batched_tokens, int) and self.max_num_batched_tokens >= 1,
               f"max_num_batched_tokens={self.max_num_batched_tokens!r}: must be an integer >= 1")
        _check(isinstance(self.max_num_seqs, int) and self.max_num_seqs >= 1,
               f"max_num_seqs={self.max_num_seqs!r}: must be an integer >= 1")


@dataclass
class SpecConfig:
    """Speculative decoding settings (Leviathan et al. 2023; Chen et al. 2023).

    Args:
        method: "off", "ngram" (prompt lookup), "draft" (a small draft model) or "synthetic"
            (acceptance pinned to ``alpha``, for timing studies; its text is not model output).
        num_speculative_tokens: k, draft tokens proposed per verify step (1..16); with a draft
            tree, its depth (the most drafts one verify can accept).
        draft_topk: children a draft-tree node may get (SGLang's ``--speculative-eagle-topk``);
            1 (the default) drafts a chain. 1..8.
        num_draft_tokens: nodes of the draft tree verified per step (SGLang's
            ``--speculative-num-draft-tokens``): k..64, None = k (a chain), at most what the tree
            holds, topk + (k - 1) x topk^2 (``minispec.base.tree_shape.max_tree_nodes``). More than k
            needs draft_topk > 1. Each costs a verify row, a KV slot and a token of the step's budget.
        policy: when to speculate: "always", "never", "threshold:N", "lane",
            "schedule:1-4:4,5-16:2,17-:0", "auto" or "goodput" (see minispec.speculation.policy).
        draft_model: alias, directory or hub name of the draft model (method "draft").
        alpha: per-position acceptance probability for method "synthetic", in [0, 1].
        ngram_min, ngram_max: suffix lengths the n-gram drafter tries, longest first.
        draft_confidence_threshold: in [0, 1). A draft model (method "draft") drafts a position only
            while its highest probability there is at least this value; drafting for that request
            stops at the first position below it, so an unsure draft proposes fewer than k (0 = a
            plain decode) and the verify step stays narrow. 0 proposes all k. The rule reads the
            draft's distribution before a token is drawn, so outputs stay exact. After the
            confidence stopping rule of transformers' assisted generation
            (``assistant_confidence_threshold``) and EAGLE-2's finding that draft confidence tracks
            acceptance (Li et al. 2024, sec. 3).
        jump_forward: for a request with structured output: where its grammar allows exactly one
            token, propose it as a draft without asking the drafter (minispec/structured/grammar_executor.py).
        mask_draft: for a request with structured output: a draft model or EAGLE head drafts from
            its distribution masked by the grammar (llama.cpp's way); False drafts unmasked and
            cuts what the grammar rejects (vLLM's way). docs/architecture.md has the measurement.
    """

    method: str = "off"
    num_speculative_tokens: int = 4
    policy: str = "always"
    draft_model: str | None = None
    alpha: float = 0.6
    ngram_min: int = 1
    ngram_max: int = 4
    draft_confidence_threshold: float = 0.0
    draft_topk: int = 1
    num_draft_tokens: int | None = None
    jump_forward: bool = True
    mask_draft: bool = True

    def __post_init__(self) -> None:
        _check(self.method in SPEC_METHODS,
               f"spec method {self.method!r} is unknown: choose one of {', '.join(SPEC_METHODS)}")
        _check(isinstance(self.num_speculative_tokens, int) and 1 <= self.num_speculative_tokens <= 16,
               f"num_speculative_tokens (k)={self.num_speculative_tokens!r}: must be an integer in 1..16")
        _check(0.0 <= float(self.alpha) <= 1.0, f"alpha={self.alpha!r}: must be in [0, 1]")
        threshold = self.draft_confidence_threshold
        _check(is_number(threshold) and 0.0 <= threshold < 1.0,
               f"draft_confidence_threshold={self.draft_confidence_threshold!r}: must be a number in [0, 1)")
        _check(1 <= self.ngram_min <= self.ngram_max,
               f"ngram_min={self.ngram_min}, ngram_max={self.ngram_max}: need 1 <= ngram_min <= ngram_max")
        k, topk, nodes = self.num_speculative_tokens, self.draft_topk, self.num_draft_tokens
        _check(is_int(topk) and 1 <= topk <= 8,
               f"draft_topk={topk!r}: must be an integer in 1..8 (1 = a chain)")
        _check(nodes is None or (is_int(nodes) and k <= nodes <= 64),
               f"num_draft_tokens={nodes!r}: must be None (= k) or an integer in k..64 (k={k}), "
               "the tree's nodes")
        _check(nodes is None or nodes == k or topk > 1,
               f"num_draft_tokens={nodes} with draft_topk=1: a chain has exactly k={k} drafts; "
               "raise draft_topk to draft a tree, or drop num_draft_tokens")
        for name in ("jump_forward", "mask_draft"):
            _check(isinstance(getattr(self, name), bool),
                   f"{name}={getattr(self, name)!r}: must be True or False")
        most = max_tree_nodes(k, topk)
        _check(nodes is None or nodes <= most,
               f"num_draft_tokens={nodes}: a tree of depth k={k} with draft_topk={topk} holds at most "
               f"topk + (k - 1) x topk^2 = {most} nodes (each depth expands its topk most likely nodes); "
               f"choose num_draft_tokens in {k}..{min(most, 64)}, "
               "or raise num_speculative_tokens or draft_topk")

    @property
    def enabled(self) -> bool:
        return self.method != "off"

    @property
    def draft_shape(self) -> DraftShape:
        """The draft a request gets at the full k: its depth k, topk and nodes (k for a chain)."""
        return DraftShape(self.num_speculative_tokens, self.draft_topk, self.num_draft_tokens)


@dataclass
class EngineConfig:
    """Everything needed to build an :class:`~minispec.core.engine.Engine`.

    Args:
        model: alias (see ``minispec.models.loader.ALIASES``), local checkpoint directory or hub name.
        device: "cpu", "cuda", "cuda:1", ... or None to pick CUDA when present.
        dtype: "float32", "bfloat16", "float16" or None (float32 on CPU, bfloat16 on CUDA).
        seed: seeds the engine's generator; requests without their own seed draw from it.
        block_size: tokens per KV block (Kwon et al. 2023, PagedAttention, section 4.1).
        num_kv_blocks: size of the KV block pool; None derives it from ``kv_cache_bytes``.
        kv_cache_bytes: bytes for the pool when ``num_kv_blocks`` is None; with a draft model it
            covers both pools (target and draft K/V, split by their bytes per token).
        max_model_len: longest sequence (prompt + output) in tokens; None = the model's limit.
        kernels: "fast" (default: oneDNN pre-packed weights on CPU, so a step of 2 to 32 tokens
            costs about what one token does; a second copy of the weights) or "reference" (the
            plain ``x @ W`` every equivalence test checks). See minispec/models/kernels.py.
        weights: storage of the projections and LM head, for target and draft: "float32",
            "bfloat16", "int8" (symmetric, a scale per output channel) or "int4" (4-bit codes, a
            scale and zero per 32 weights: the bundled checkpoint's own, about a sixth of float32's
            bytes); None keeps ``dtype``. See minispec/models/kernels.py.
        enable_prefix_caching: reuse the K/V of full blocks that an earlier request computed for the
            same prefix (a shared system prompt, earlier turns of a chat) instead of computing them
            again; on by default, as in vLLM V1. See minispec/base/kv_cache.py.
        cuda_graphs: record each decode and verify batch shape once as a CUDA graph and replay
            it (minispec/graphs/cuda_graphs.py); None = on for CUDA, off elsewhere; True needs CUDA.
        compile: on a CPU, compile the decode and verify step once per batch bucket with
            torch.compile (minispec/graphs/compiled_step.py); None = off (each bucket's first
            compile costs tens of seconds: docs/cost_model.md, section 11); True needs a CPU and a
            C++ compiler.
    """

    model: str = "smollm2-135m-instruct"
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    max_model_len: int | None = None
    kernels: str = "fast"
    weights: str | None = None
    enable_prefix_caching: bool = True
    cuda_graphs: bool | None = None
    compile: bool | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)

    def __post_init__(self) -> None:
        _check(isinstance(self.block_size, int) and 1 <= self.block_size <= 1024,
               f"block_size={self.block_size!r}: must be an integer in 1..1024")
        _check(self.num_kv_blocks is None
               or (isinstance(self.num_kv_blocks, int) and self.num_kv_blocks >= 1),
               f"num_kv_blocks={self.num_kv_blocks!r}: must be None or an integer >= 1")
        _check(isinstance(self.kv_cache_bytes, int) and self.kv_cache_bytes >= 1,
               f"kv_cache_bytes={self.kv_cache_bytes!r}: must be an integer >= 1")
        _check(self.max_model_len is None
               or (isinstance(self.max_model_len, int) and self.max_model_len >= 2),
               f"max_model_len={self.max_model_len!r}: must be None or an integer >= 2")
        _check(self.kernels in KERNELS, f"kernels={self.kernels!r}: choose one of {', '.join(KERNELS)}")
        _check(self.weights is None or self.weights in WEIGHT_FORMATS,
               f"weights={self.weights!r}: choose None or one of {', '.join(WEIGHT_FORMATS)}")
        _check(isinstance(self.enable_prefix_caching, bool),
               f"enable_prefix_caching={self.enable_prefix_caching!r}: must be True or False")
        _check(self.cuda_graphs in (None, True, False),
               f"cuda_graphs={self.cuda_graphs!r}: must be None (on for CUDA), True or False")
        _check(self.compile in (None, True, False),
               f"compile={self.compile!r}: must be None (off), True or False")
        _check(self.dtype in (None, "float32", "bfloat16", "float16"),
               f"dtype={self.dtype!r}: choose None, 'float32', 'bfloat16' or 'float16'")
        _check(self.dtype != "float16" or self.weights is not None, "dtype='float16': no kernel takes "
               "float16 weights: give weights too (float32, bfloat16, int8, int4) or use dtype 'bfloat16'")
