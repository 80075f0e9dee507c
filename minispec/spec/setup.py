"""Build the drafter and policy an EngineConfig asks for, checking draft/target compatibility.

A draft model must share the target's tokenizer: the same token for the same id. A vocabulary
padded to another size is fine (extra ids get zero probability); a different tokenizer is refused,
since its ids would mean other strings and every draft would be rejected or, worse, mis-scored.
Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

import torch

from minispec.config import EngineConfig
from minispec.executor import ModelRunner
from minispec.kv_cache import BlockManager, KVCache
from minispec.models.loader import BUNDLED_TARGET
from minispec.spec.drafters import DraftModelDrafter, NgramDrafter, SyntheticDrafter
from minispec.spec.eagle import EagleDraft, EagleDrafter
from minispec.spec.policy import make_policy

DEFAULT_DRAFTS = {BUNDLED_TARGET: "smollm2-135m-draft"}


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
        raise ValueError(f"the draft model's tokenizer differs from the target's in {len(diff)} ids{example}: "
                         "speculative decoding needs a draft with the target's tokenizer")


def draft_name(config: EngineConfig) -> str:
    """The draft model to load: ``spec.draft_model``, else the default for the target."""
    name = config.spec.draft_model or DEFAULT_DRAFTS.get(config.model)
    if name is None:
        raise ValueError(f"--spec draft needs a draft model for {config.model!r}: pass --draft MODEL "
                         f"(a default exists only for {', '.join(DEFAULT_DRAFTS)})")
    return name


def _policy(spec, target, dtype, draft_model=None):
    """The step policy; "auto" and "goodput" get a cost model of the live target (and draft) on
    the profiled hardware, data/hardware/this.json (see minispec.spec.adaptive)."""
    cost_model = None
    if spec.policy.partition(":")[0] in ("auto", "goodput"):
        from minispec.spec.adaptive import engine_cost_model

        cost_model = engine_cost_model(target, dtype, draft_model)
    return make_policy(spec.policy, spec.num_speculative_tokens, cost_model=cost_model)


def make_drafter(config: EngineConfig, target, tokenizer, num_blocks: int, device, dtype, draft=None):
    """Return (drafter or None, policy or None, the draft's maximum length or None).

    Args:
        draft: for method "draft", an already-loaded draft: a LlamaModel, or the tuple
            (model, tokenizer, vocab_map) from ``load_draft``; None loads ``draft_name(config)``.
    """
    spec = config.spec
    if not spec.enabled:
        return None, None, None
    policy = _policy(spec, target, dtype)
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max), policy, None
    if spec.method == "synthetic":
        return SyntheticDrafter(spec.alpha, seed=config.seed), policy, None
    if draft is None:
        from minispec.models.draft import load_draft

        draft = load_draft(draft_name(config), target, device, dtype)
    draft_model, draft_tokenizer, vocab_map = draft if isinstance(draft, tuple) else (draft, None, None)
    check_vocab_compatible(tokenizer, draft_tokenizer)
    draft_model = draft_model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    policy = _policy(spec, target, dtype, draft_model)
    cfg = draft_model.cfg
    bm = BlockManager(num_blocks, config.block_size)
    kv = KVCache(cfg.num_layers, num_blocks, config.block_size, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    kind = EagleDrafter if isinstance(draft_model, EagleDraft) else DraftModelDrafter
    drafter = kind(ModelRunner(draft_model, kv, bm, device), target.cfg.vocab_size, vocab_map)
    return drafter, policy, cfg.max_position_embeddings
