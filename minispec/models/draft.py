"""Load a draft model: any model the loader knows, or minispec's own distilled draft.

A shipped draft (data/draft/) holds only the weights it trained; its embedding and LM-head columns
are the target's own and are rebuilt from the target at load time. Invariant: a shipped draft loads
only against the target it was distilled from (vocabulary, width and an embedding fingerprint are
checked). Taught in notebooks/04_speculative_decoding.ipynb; the files are described in
data/draft/MODEL_CARD.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn

from minispec.models.eagle import build_eagle
from minispec.models.llama import LlamaModel
from minispec.models.loader import load_model, resolve_model

CHECKSUM_ROWS = 64  # target embedding rows fingerprinted in draft_config.json
SHARED_WITH_TARGET = ("embed_tokens", "lm_head")  # rebuilt from the target at load time, never shipped
CONFIG_KEYS = ("target_vocab_size", "target_hidden_size", "target_embedding_checksum")


def own_state(draft: LlamaModel) -> dict[str, torch.Tensor]:
    """The draft's trained weights (layers and final norm): what is shipped. The rest
    (SHARED_WITH_TARGET) is the target's own, frozen in training and rebuilt at load time."""
    return {k: v for k, v in draft.state_dict().items() if k not in SHARED_WITH_TARGET}


def weight_mismatch(own: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """How the weights ``tensors`` read from a file fail to fit a draft whose ``own_state`` is ``own``:
    {"missing": ..., "unexpected": ..., "wrong shape": ...}, each a sorted list of names, empty lists
    left out ({} when the file fits)."""
    found = {"missing": sorted(set(own) - set(tensors)), "unexpected": sorted(set(tensors) - set(own)),
             "wrong shape": sorted(k for k in set(own) & set(tensors) if own[k].shape != tensors[k].shape)}
    return {label: names for label, names in found.items() if names}


def describe_mismatch(mismatch: dict[str, list[str]]) -> str:
    """``weight_mismatch``'s result as text: at most five names per kind."""
    return "; ".join(f"{label} {names[:5]}{' ...' if len(names) > 5 else ''}"
                     for label, names in mismatch.items())


def embedding_checksum(target: LlamaModel) -> float:
    """Sum of |weights| of the first embedding rows: tells targets apart, robust to bfloat16 rounding."""
    return float(target.embed_tokens[:CHECKSUM_ROWS].double().abs().sum())


def to_target_vocab(logits: torch.Tensor, target_vocab_size: int,
                    vocab_map: torch.Tensor | None = None) -> torch.Tensor:
    """Draft logits [M, V_draft] -> [M, V_target] float, -inf where the draft has no token: draft
    column i scores target id ``vocab_map[i]`` (a reduced vocabulary, FR-Spec, Zhao et al. 2025),
    or, without a map, the columns are cut or padded to the target's size."""
    v = target_vocab_size
    if vocab_map is not None:
        full = logits.new_full((logits.shape[0], v), float("-inf"))
        full[:, vocab_map] = logits
        return full
    if logits.shape[1] >= v:
        return logits[:, :v]
    pad = logits.new_full((logits.shape[0], v - logits.shape[1]), float("-inf"))
    return torch.cat([logits, pad], dim=1)


def build_draft(target: LlamaModel, layer_ids: list[int], vocab_map: torch.Tensor) -> LlamaModel:
    """A draft made of target layers ``layer_ids`` (copied), the target's final norm (copied), and the
    target's embedding (shared, all V_target rows: the draft reads target ids) and LM-head columns
    ``vocab_map`` (frozen). Returns a float32 LlamaModel with cfg.vocab_size = len(vocab_map).

    Raises: ValueError for a layer id outside the target or a vocab_map id outside its vocabulary.
    """
    cfg = target.cfg
    if not layer_ids or min(layer_ids) < 0 or max(layer_ids) >= cfg.num_layers:
        raise ValueError(f"layer ids {layer_ids}: need at least one, each in 0..{cfg.num_layers - 1}")
    if vocab_map.numel() == 0 or int(vocab_map.min()) < 0 or int(vocab_map.max()) >= cfg.vocab_size:
        raise ValueError(f"vocab_map must hold target token ids in 0..{cfg.vocab_size - 1}")
    draft_cfg = replace(cfg, num_layers=len(layer_ids), vocab_size=int(vocab_map.numel()),
                        tie_word_embeddings=False)
    with torch.device("meta"):
        draft = LlamaModel(draft_cfg)
    draft = draft.to_empty(device="cpu").float()
    with torch.no_grad():
        for mine, i in zip(draft.layers, layer_ids):
            mine.load_state_dict({k: v.float() for k, v in target.layers[i].state_dict().items()})
        draft.norm.copy_(target.norm.float())
    # [V_target, E]
    draft.embed_tokens = nn.Parameter(target.embed_tokens.detach().float(), requires_grad=False)
    draft.lm_head = nn.Parameter(target.lm_head.detach().float()[:, vocab_map].contiguous(),
                                 requires_grad=False)
    draft.inv_freq = target.inv_freq.clone()
    draft.attention_scaling = target.attention_scaling
    return draft


def read_shipped_draft(path, target: LlamaModel) -> tuple[dict, dict[str, torch.Tensor], torch.Tensor]:
    """Read a shipped draft's files from ``path`` and check that they fit ``target``.

    Returns: (draft_config.json as a dict, the draft's own weights {name: float16 tensor}, vocab_map
    [V_draft] long on CPU: draft logit i scores target token vocab_map[i]).
    Raises: ValueError naming the file when draft_config.json is not a JSON object with the
    target's fingerprint (CONFIG_KEYS), when model.safetensors is missing, unreadable or has no
    vocab_map, or when ``target`` is not the model the draft was distilled from.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    config_file, weights_file = path / "draft_config.json", path / "model.safetensors"
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file} is not valid JSON ({exc}): a shipped draft's config is written by "
                         f"python -m minispec.train") from None
    missing = [k for k in CONFIG_KEYS if not isinstance(config, dict) or k not in config]
    if missing:
        raise ValueError(f"{config_file} lacks {', '.join(missing)}: a shipped draft's config records the "
                         f"target it was distilled from")
    tcfg = target.cfg
    same_shape = ((tcfg.vocab_size, tcfg.hidden_size)
                  == (config["target_vocab_size"], config["target_hidden_size"]))
    if not same_shape or not math.isclose(embedding_checksum(target), config["target_embedding_checksum"],
                                          rel_tol=1e-3):
        raise ValueError(f"the draft in {path} was distilled from {config.get('target')!r} and does not fit "
                         f"this target (vocab {tcfg.vocab_size}, hidden {tcfg.hidden_size}, "
                         "other embedding weights)")
    if not weights_file.is_file():
        raise ValueError(f"{weights_file} is missing: a shipped draft is draft_config.json plus "
                         "model.safetensors")
    try:
        tensors = load_file(str(weights_file))
    except (SafetensorError, OSError) as exc:  # SafetensorError: a cut or empty file
        raise ValueError(f"{weights_file} is not a readable safetensors file ({exc})") from None
    if "vocab_map" not in tensors:
        raise ValueError(f"{weights_file} has no vocab_map: a shipped draft stores the target ids of its "
                         "vocabulary")
    vocab_map = tensors.pop("vocab_map").long()
    return config, tensors, vocab_map


def load_shipped_draft(path, target: LlamaModel, device: torch.device, dtype: torch.dtype):
    """Load minispec's distilled draft from ``path`` for ``target``.

    Returns: (draft LlamaModel in eval mode (an EagleDraft for kind "eagle"), None for the tokenizer
    (it is the target's, checked by the embedding fingerprint), vocab_map [V_draft] long on CPU).
    Raises: ValueError when ``target`` is not the model the draft was distilled from, or when the
    weights file lacks one of the draft's own weights, holds a weight it has not, or has a wrong shape
    (an untrained head would otherwise run silently, accepting almost nothing).
    """
    config, tensors, vocab_map = read_shipped_draft(path, target)
    if config.get("kind") == "eagle":
        draft = build_eagle(target, vocab_map, config["init_layer"], tuple(config.get("feature_layers", ())))
    else:
        draft = build_draft(target, list(range(config["model_config"]["num_layers"])), vocab_map)
    mismatch = weight_mismatch(own_state(draft), tensors)
    if mismatch:
        raise ValueError(f"{Path(path) / 'model.safetensors'} does not match its draft_config.json "
                         f"(kind {config.get('kind', 'layers')!r}): weights {describe_mismatch(mismatch)}")
    # shared ones: the target's
    draft.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=False)
    return draft.to(device=device, dtype=dtype).eval().requires_grad_(False), None, vocab_map


def load_draft(name: str, target, device: torch.device, dtype: torch.dtype):
    """Returns (draft LlamaModel, tokenizer or None, vocab_map or None).

    Raises: ValueError when the name resolves to nothing loadable.
    """
    source = resolve_model(name)
    folder = Path(source.path)
    if (folder / "draft_config.json").exists():
        return load_shipped_draft(source.path, target, device, dtype)
    if source.name == "smollm2-135m-draft":
        raise ValueError(f"the shipped draft is missing from {source.path}: pass another draft model")
    if folder.is_dir() and not source.gguf_file and not (folder / "config.json").exists():
        raise ValueError(f"draft {name!r}: the folder {folder} holds neither a minispec draft "
                         "(draft_config.json and model.safetensors) nor a Hugging Face model (config.json)")
    model, tokenizer, _ = load_model(name, device, dtype)
    return model, tokenizer, None
