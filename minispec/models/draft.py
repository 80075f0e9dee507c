"""Load a draft model: any model the loader knows, or minispec's own distilled draft.

Taught in notebooks/04_speculative_decoding.ipynb.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minispec.models.loader import load_model, resolve_model


def load_draft(name: str, target, device: torch.device, dtype: torch.dtype):
    """Returns (draft LlamaModel, tokenizer or None, vocab_map or None).

    Raises: ValueError when the name resolves to nothing loadable.
    """
    source = resolve_model(name)
    if (Path(source.path) / "draft_config.json").exists():
        from minispec.train_draft import load_shipped_draft

        return load_shipped_draft(source.path, target, device, dtype)
    if source.name == "smollm2-135m-draft":
        raise ValueError(f"the shipped draft is missing from {source.path}: pass another draft model")
    model, tokenizer, _ = load_model(name, device, dtype)
    return model, tokenizer, None
