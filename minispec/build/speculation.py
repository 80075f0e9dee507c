"""Build the drafter and policy an EngineConfig asks for, checking draft/target compatibility.

A draft model must share the target's tokenizer: the same token for the same id. A vocabulary
padded to another size is fine (extra ids get zero probability); a different tokenizer is refused,
since its ids would mean other strings and every draft would be rejected or, worse, mis-scored.
Every drafter is built able to draft trees (speculation/tree_drafters.py) and wrapped in a
``DrafterGuard`` (minispec/speculation/drafter_guard.py). A drafter that reads the target's features
declares them (``feature_channel``); the builder sizes the pool and the target's runner for them.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from minispec.core.block_manager import BlockManager
from minispec.base.config import EngineConfig
from minispec.build.pool import build_runner
from minispec.speculation.drafter_guard import DrafterGuard
from minispec.structured.grammar import StructuredOutputManager
from minispec.structured.grammar_executor import DraftMask
from minispec.models.draft import load_draft
from minispec.models.eagle import EagleDraft
from minispec.models.loader import BUNDLED_TARGET
from minispec.speculation.adaptive import ADAPTIVE_POLICIES, make_adaptive_policy
from minispec.speculation.eagle import EagleDrafter
from minispec.speculation.features import FeatureChannel, FeatureStore
from minispec.speculation.policy import SpecPolicy, make_step_policy
from minispec.speculation.synthetic import SyntheticDrafter
from minispec.speculation.tree_drafters import TreeDraftModelDrafter, TreeNgramDrafter
from minispec.base.tree_shape import DraftShape

DEFAULT_DRAFTS = {BUNDLED_TARGET: "smollm2-135m-draft"}


def needs_cost_model(policy: str) -> bool:
    """True for the policies that price steps with a cost model ("auto", "goodput")."""
    return policy.partition(":")[0] in ADAPTIVE_POLICIES


def make_policy(text: str, k: int, cost_model=None, tree: DraftShape | None = None) -> SpecPolicy:
    """Any policy from its CLI spelling (``minispec.speculation.policy.POLICY_HELP``); "auto" and
    "goodput" need ``cost_model`` (a ``minispec.cost.model.CostModel``). ``tree``: the draft
    tree a policy drafts at its full k ("goodput" prices it against its chain plan each step;
    "auto" drafts chains).

    Raises: ValueError for an unknown spelling or an adaptive policy without a cost model.
    """
    name, _, arg = text.partition(":")
    if name in ADAPTIVE_POLICIES:
        return make_adaptive_policy(name, k, arg, cost_model, tree)
    return make_step_policy(text, k, tree)


def spec_tree(spec) -> DraftShape | None:
    """The draft tree a SpecConfig asks for (``draft_topk``, ``num_draft_tokens``), None for a chain."""
    shape = spec.draft_shape
    return shape if shape.is_tree else None


def engine_policy(spec, policy: SpecPolicy | None, cost_model=None) -> SpecPolicy | None:
    """The step policy an engine runs, real or simulated: ``policy`` when one is given, else the
    one ``spec.policy`` spells (``cost_model`` prices "auto" and "goodput"), else None when
    speculation is off.

    Args:
        spec: the engine's ``minispec.base.config.SpecConfig``.
    Raises: ValueError for a policy object given while ``spec.method`` is "off", and as make_policy.
    """
    if policy is not None and not spec.enabled:
        raise ValueError("a speculation policy was given but spec method is 'off': choose a method")
    if policy is None and spec.enabled:
        policy = make_policy(spec.policy, spec.num_speculative_tokens, cost_model, spec_tree(spec))
    return policy


def check_vocab_compatible(target_tokenizer, draft_tokenizer) -> None:
    """Raise ValueError unless both tokenizers map the same ids to the same tokens.

    Only ids present in both are compared, so a vocabulary padded to a larger size passes.
    """
    if target_tokenizer is None or draft_tokenizer is None:
        return
    t_vocab = {i: t for t, i in target_tokenizer.get_vocab().items()}
    d_vocab = {i: t for t, i in draft_tokenizer.get_vocab().items()}
    shared = set(t_vocab) & set(d_vocab)
    diff = [i for i in sorted(shared) if t_vocab[i] != d_vocab[i]]
    if diff or len(shared) < 0.9 * min(len(t_vocab), len(d_vocab)):
        example = f" (id {diff[0]}: {t_vocab[diff[0]]!r} vs {d_vocab[diff[0]]!r})" if diff else ""
        raise ValueError(f"the draft model's tokenizer differs from the target's in {len(diff)} "
                         f"ids{example}: "
                         "speculative decoding needs a draft with the target's tokenizer")


def draft_name(config: EngineConfig) -> str:
    """The draft model to load: ``spec.draft_model``, else the default for the target."""
    name = config.spec.draft_model or DEFAULT_DRAFTS.get(config.model)
    if name is None:
        raise ValueError(f"--spec draft needs a draft model for {config.model!r}: pass --draft MODEL "
                         f"(a default exists only for {', '.join(DEFAULT_DRAFTS)})")
    return name


def load_draft_model(config: EngineConfig, target, tokenizer, device, dtype, draft=None):
    """The draft model for ``spec.method == "draft"``: (model on device, vocab_map or None).

    Args:
        draft: an already-loaded draft: a LlamaModel, or the tuple (model, tokenizer, vocab_map)
            from ``load_draft``; None loads ``draft_name(config)``.
    Raises: ValueError for an unknown draft or a tokenizer that differs from the target's.
    """
    if draft is None:
        draft = load_draft(draft_name(config), target, device, dtype)
    draft_model, draft_tokenizer, vocab_map = draft if isinstance(draft, tuple) else (draft, None, None)
    check_vocab_compatible(tokenizer, draft_tokenizer)
    return draft_model.to(device=device, dtype=dtype).eval().requires_grad_(False), vocab_map


def feature_channel(config: EngineConfig, draft_model) -> FeatureChannel | None:
    """The target features the drafter ``config`` asks for reads per position, as it declares
    them (``EagleDrafter.feature_channel``: an EAGLE head drafts from them), or None: the builder
    budgets them in the KV pool and has the target's runner capture their layers."""
    if config.spec.method == "draft" and isinstance(draft_model, EagleDraft):
        return EagleDrafter.feature_channel(draft_model)
    return None


def make_drafter(config: EngineConfig, target_vocab_size: int, target_blocks: BlockManager, device, dtype,
                 draft_model=None, vocab_map=None, graphs: bool = False,
                 grammars: StructuredOutputManager | None = None,
                 compiled: bool = False) -> DrafterGuard | None:
    """The drafter ``config.spec`` asks for, wrapped in a DrafterGuard, or None when speculation is
    off. A draft model gets its own KV cache of as many blocks as the target's pool
    ``target_blocks`` (no prefix caching: see DraftModelDrafter) and its own runner; an EAGLE head
    also gets a FeatureStore over the target's slots (``feature_channel``). ``graphs``: the
    draft's runner replays CUDA graphs for its equal-width steps (minispec/graphs/cuda_graphs.py);
    ``compiled``: a draft model's runner compiles them on a CPU (minispec/graphs/compiled_step.py).
    ``grammars``: the engine's StructuredOutputManager; a draft model or head drafts under its
    masks when ``spec.mask_draft``."""
    spec = config.spec
    if not spec.enabled:
        return None
    if spec.method == "ngram":
        drafter = TreeNgramDrafter(spec.ngram_min, spec.ngram_max)
    elif spec.method == "synthetic":
        drafter = SyntheticDrafter(spec.alpha, seed=config.seed)
    else:
        bm = BlockManager(target_blocks.num_blocks, config.block_size)
        channel = feature_channel(config, draft_model)
        runner = build_runner(draft_model, bm, device, dtype, graphs, compiled and channel is None,
                              kernels=config.kernels, weights=config.weights)
        budget = config.scheduler.max_num_batched_tokens  # a long catch-up is chunked like a prefill
        mask = DraftMask(grammars, vocab_map) if spec.mask_draft and grammars is not None else None
        if channel is None:
            drafter = TreeDraftModelDrafter(runner, target_vocab_size, vocab_map,
                                            spec.draft_confidence_threshold, budget, mask)
        else:
            drafter = EagleDrafter(runner, target_vocab_size, vocab_map, spec.draft_confidence_threshold,
                                   FeatureStore(target_blocks, channel.width, dtype, device), budget, mask)
    return DrafterGuard(drafter, target_vocab_size)
