"""Shipping a distilled draft: write its files (``export_draft``); models/draft.py loads them.

Only the draft's own weights and vocabulary map go to disk; the embedding and LM-head columns are
the target's own, frozen during training, and are rebuilt from the target at load time.
Invariant: a shipped draft loads only against the target it was distilled from (read_shipped_draft
checks an embedding fingerprint). Taught in notebooks/04_speculative_decoding.ipynb; the files are
described in data/draft/MODEL_CARD.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from minispec.models.draft import embedding_checksum, own_state
from minispec.models.llama import LlamaModel


def export_draft(draft: LlamaModel, vocab_map: torch.Tensor,
                 target: LlamaModel, out: Path, meta: dict) -> None:
    """Write ``out/model.safetensors`` (own weights in float16, vocab_map int32) and draft_config.json
    (the draft's ModelConfig, the target's shape and embedding fingerprint, and ``meta``)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float16).contiguous() for k, v in own_state(draft).items()}
    tensors["vocab_map"] = vocab_map.to(torch.int32).contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    # the config's name is where the model was loaded from (a local folder): not shipped
    model_config = asdict(draft.cfg) | {"name": f"{meta.get('target', 'target')}-draft"}
    config = {"model_config": model_config, "target_vocab_size": target.cfg.vocab_size,
              "target_hidden_size": target.cfg.hidden_size,
              "target_embedding_checksum": embedding_checksum(target),
              "storage_dtype": "float16", **meta}
    (out / "draft_config.json").write_text(json.dumps(config, indent=1) + "\n")
