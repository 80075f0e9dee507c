"""Drafters as serving engines run them, for the cost model: a separate draft model, a draft head
sized from the target, or a lookup with no forward at all.

A draft model is any preset (``llama-3.2-1b``). A head is one decoder layer of the target's shape
fed by the target's own hidden states, so its size follows the target:
- ``eagle-head`` (EAGLE-1, Li et al. 2024, "EAGLE", sec. 4.1): an fc projection of the token
  embedding and the target's last hidden state (2E -> E), one decoder layer, and the target's
  own LM head, read again at every draft step (stored once, so it takes no memory of its own).
- ``eagle3-head`` (EAGLE-3, Li et al. 2025, arXiv 2503.01840, sec. 3): an fc fusing three target
  layers (3E -> E), one decoder layer whose Q/K/V read the embedding and the fused feature
  (2E wide), and its own LM head over a reduced draft vocabulary (32,000 tokens in the released
  heads, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's ``draft_vocab_size``).
- ``mtp`` (multi-token prediction, DeepSeek-AI 2024, "DeepSeek-V3", sec. 2.2): a projection of
  the embedding and the hidden state (2E -> E), one transformer block, and the target's
  embedding and output head shared.
Engines run a head k times per step (k forwards of one layer), as they run a draft model.
``ngram`` and ``suffix`` look tokens up in the prompt and output (prompt lookup, Saxena 2023;
SuffixDecoding, Oliaro et al. 2024): no forward, so they cost nothing in the simulator.
The fc projection runs only on the target's features in the first draft forward; charging it on
every draft forward overstates a head's bytes by about 12% (EAGLE-3 on Llama-3.1-8B).
Invariant: a head's counts are derived from the target's shape, never typed in.
Taught in notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

from dataclasses import replace

from minispec.cost.modelspec import ModelSpec, load_model_spec

HEADS = ("eagle-head", "eagle3-head", "mtp")
FREE_DRAFTERS = ("ngram", "suffix")
EAGLE3_DRAFT_VOCAB = 32000  # draft_vocab_size of the released EAGLE-3 heads (module doc)


def head_spec(kind: str, target: ModelSpec) -> ModelSpec:
    """The draft head ``kind`` ("eagle-head", "eagle3-head", "mtp") sized from ``target``: one
    layer of the target's shape, the extra projections as ``extra_weights``, and what it shares
    with the target as ``shared_params``; stored in the target's dtypes.

    Raises: ValueError for a kind that is not a head.
    """
    e = target.hidden_size
    qkv_out = (target.num_heads + 2 * target.num_kv_heads) * target.head_dim
    embedding = target.vocab_size * e
    target_head = target.num_lm_head_rows * e
    one_layer = dict(num_layers=1, max_position_embeddings=target.max_position_embeddings)
    if kind == "eagle-head":  # fc 2E -> E; the target's LM head, read per forward, stored once
        return replace(target, name=f"EAGLE head ({target.name})", extra_weights=2 * e * e,
                       tie_word_embeddings=False, lm_head_size=None,
                       shared_params=embedding + target_head, **one_layer)
    if kind == "eagle3-head":  # fc 3E -> E, Q/K/V over 2E, its own head over the draft vocabulary
        return replace(target, name=f"EAGLE-3 head ({target.name})", extra_weights=3 * e * e + e * qkv_out,
                       tie_word_embeddings=False, lm_head_size=min(EAGLE3_DRAFT_VOCAB, target.vocab_size),
                       shared_params=embedding, **one_layer)
    if kind == "mtp":  # projection 2E -> E, one block; embedding and output head shared
        return replace(target, name=f"MTP head ({target.name})", extra_weights=2 * e * e,
                       tie_word_embeddings=False, lm_head_size=None,
                       shared_params=embedding + target_head, **one_layer)
    raise ValueError(f"draft head {kind!r} is unknown: choose one of {', '.join(HEADS)}")


def resolve_drafter(name, target: ModelSpec,
                    weight_dtype: str, kv_dtype: str | None = None) -> ModelSpec | None:
    """What a ``--draft`` value costs: a head's spec, None for a lookup drafter (no forward), or
    the draft model ``name`` (a preset, config path or ModelSpec) in the given dtypes.

    Raises: ValueError for an unknown model name or dtype.
    """
    if isinstance(name, str) and name in FREE_DRAFTERS:
        return None
    if isinstance(name, str) and name in HEADS:
        return head_spec(name, target)
    return load_model_spec(name, weight_dtype, kv_dtype or weight_dtype)
