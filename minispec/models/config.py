"""The shape of a Llama-family decoder, and the counts every other part derives from it.

One definition serves the real model (``LlamaModel`` allocates its tensors from it), the KV cache
(bytes per token), and the simulator's cost model (parameters and bytes read per step). A shape
comes from a transformers config (object or config.json dict), a checkpoint directory, or a preset
in data/models/ (a transformers-style config plus its source).
Invariant: every count is derived from the shape fields, never typed in twice, so a preset and the
live model of the same shape give the same numbers. Plain arithmetic: no torch here.
Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"
# engine aliases whose shapes a preset describes
PRESET_ALIASES = {"smollm2-135m-instruct": "smollm2-135m"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a Llama-family model.

    Args:
        name: display name.
        vocab_size (V): rows of the embedding.
        hidden_size (E), intermediate_size (I), num_layers (L), num_heads (H),
        num_kv_heads (Hkv), head_dim (D).
        lm_head_size: columns of the LM head when it covers only part of the vocabulary (a draft
            keeping the frequent tokens, FR-Spec, Zhao et al. 2025); None means V.
        rope_theta, rms_norm_eps: RoPE base and RMSNorm epsilon.
        max_position_embeddings: longest sequence the model supports.
        tie_word_embeddings: the LM head is the embedding matrix (stored once).
        qkv_bias: Qwen2-style biases on the Q, K and V projections.
    Raises:
        ValueError: for a size below 1, or H not a multiple of Hkv.
    """

    name: str = "model"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    lm_head_size: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        for field_name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                           "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: {field_name}={value!r} must be an integer >= 1")
        if (self.lm_head_size is not None
                and (not isinstance(self.lm_head_size, int) or self.lm_head_size < 1)):
            raise ValueError(f"model {self.name!r}: lm_head_size={self.lm_head_size!r} must be None or >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    @classmethod
    def tiny(cls, vocab_size: int = 256, num_layers: int = 2, max_position_embeddings: int = 512,
             **overrides) -> ModelConfig:
        """The small Llama shape tests, CI runs and the course's engine exercises use (width 64, 4
        heads over 2 KV heads, tied embeddings): every code path, milliseconds per step."""
        shape = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_layers=num_layers,
                     num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
                     max_position_embeddings=max_position_embeddings)
        return cls(**{**shape, **overrides})

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_lm_head_rows(self) -> int:
        """Output columns of the LM head (the vocabulary it scores)."""
        return self.lm_head_size or self.vocab_size

    @property
    def num_layer_params(self) -> int:
        """Matmul weights of all L layers: L (E(H + 2Hkv)D + HDE + 3EI), QKV biases included."""
        e, d = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * d
        attn = e * qkv_out + (qkv_out if self.qkv_bias else 0) + self.num_heads * d * e
        return self.num_layers * (attn + 3 * e * self.intermediate_size)

    @property
    def num_params(self) -> int:
        """All parameters: embedding, layers, norms, and the LM head unless tied to the embedding."""
        e = self.hidden_size
        embed = self.vocab_size * e
        head = 0 if self.tie_word_embeddings and self.lm_head_size in (None, self.vocab_size) \
            else self.num_lm_head_rows * e
        norms = (2 * self.num_layers + 1) * e
        return embed + self.num_layer_params + head + norms

    @property
    def num_weights_per_step(self) -> int:
        """Weights one forward streams from memory: every layer matmul and the LM head. The
        embedding is a gather of N rows, costed per token."""
        return self.num_layer_params + self.num_lm_head_rows * self.hidden_size

    @property
    def kv_elements_per_token(self) -> int:
        """K and V of one token across all layers: 2 L Hkv D elements (times bytes per element)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    # -- from transformers ---------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg, name: str | None = None) -> "ModelConfig":
        """From a transformers config object (LlamaConfig, Qwen2Config, ...) or a config.json dict.

        Raises: ValueError when a required field (hidden_size, num_hidden_layers, ...) is missing.
        """
        get = cfg.get if isinstance(cfg, dict) else (lambda key, default=None: getattr(cfg, key, default))
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if get(k) is None]
        if missing:
            raise ValueError(f"config of {name or 'model'!r} lacks {', '.join(missing)}: "
                             "give a Llama-family transformers config")
        heads = get("num_attention_heads")
        rope = get("rope_parameters") or {}
        return cls(
            name=name or get("name") or get("_name_or_path") or get("model_type") or "model",
            vocab_size=get("vocab_size"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_layers=get("num_hidden_layers"),
            num_heads=heads, num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads, lm_head_size=get("lm_head_size"),
            rope_theta=float(rope.get("rope_theta", get("rope_theta") or 10000.0)),
            rms_norm_eps=float(get("rms_norm_eps") or 1e-5),
            max_position_embeddings=get("max_position_embeddings") or 4096,
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=bool(get("attention_bias", False)) or get("model_type") == "qwen2")


# -- presets -------------------------------------------------------------------------------------
def available_models() -> list[str]:
    """Preset names in data/models/."""
    return sorted(p.stem for p in MODELS_DIR.glob("*.json"))


def preset_info(name: str) -> dict:
    """The raw preset file (config, source, note). Raises ValueError for an unknown name."""
    key = PRESET_ALIASES.get(name, name).lower()
    path = MODELS_DIR / f"{key}.json"
    if not path.exists():
        raise ValueError(f"model {name!r} has no preset: choose one of {', '.join(available_models())}, "
                         "or give a transformers config.json path or a checkpoint directory")
    return json.loads(path.read_text())


def load_model_config(name_or_path) -> ModelConfig:
    """A ModelConfig from a preset name ("llama-3-8b", "random:llama-3-8b", an engine alias), a
    config.json path, a checkpoint directory holding config.json, a transformers config object or
    dict, or a ModelConfig (returned as is).

    Raises: ValueError for an unknown name, a missing file or an incomplete config.
    """
    if isinstance(name_or_path, ModelConfig):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        return ModelConfig.from_hf_config(name_or_path)
    text = str(name_or_path).removeprefix("random:")
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        return ModelConfig.from_hf_config(json.loads(path.read_text()), name=path.parent.name or text)
    info = preset_info(text)
    return ModelConfig.from_hf_config(info["config"], name=info.get("name", text))
