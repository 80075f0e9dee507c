"""Model shapes for the cost model: parameters, layers, heads, KV heads, vocabulary, bytes per weight.

A ModelSpec comes from any transformers config (object or config.json dict), from minispec's own
ModelConfig, or from a preset in data/models/ (a transformers-style config plus its source).
Weight bytes follow ``weight_dtype``, so a quantized checkpoint simply reads fewer bytes per
weight; ``kv_dtype`` does the same for the KV cache.
Invariant: every count is derived from the shape fields, never typed in twice, so a preset and
the live model of the same shape give the same cost. Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parents[2] / "data" / "models"

# bytes per stored element; int4 packs two weights per byte (scales and zero points ignored)
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
BUNDLED_VOCAB_SIZE = 49152  # SmolLM2's tokenizer: random models with at least this vocabulary use it
# engine aliases whose shapes a preset describes
PRESET_ALIASES = {"smollm2-135m-instruct": "smollm2-135m"}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype``. Raises ValueError for an unknown name."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is unknown: choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class ModelSpec:
    """Shape and storage of a Llama-family decoder, enough to cost a step.

    Args:
        name: display name.
        num_layers (L), hidden_size (E), intermediate_size (I), num_heads (H), num_kv_heads (Hkv),
        head_dim (D), vocab_size (V, the embedding's rows).
        lm_head_size: rows of the LM head (a draft may keep only the frequent tokens, as in
            FR-Spec, Zhao et al. 2025); None means V.
        tie_word_embeddings: the LM head is the embedding matrix (stored once).
        qkv_bias: Qwen2-style biases on Q, K, V (counted as parameters).
        max_position_embeddings: longest sequence the model supports.
        weight_dtype, kv_dtype: storage dtypes (see ``DTYPE_BYTES``).
    Raises:
        ValueError: for a non-positive size, H not a multiple of Hkv, or an unknown dtype.
    """

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    lm_head_size: int | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int = 4096
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                     "vocab_size", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"model {self.name!r}: {name}={value!r} must be an integer >= 1")
        if self.lm_head_size is not None and (not isinstance(self.lm_head_size, int) or self.lm_head_size < 1):
            raise ValueError(f"model {self.name!r}: lm_head_size={self.lm_head_size!r} must be None or >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        dtype_bytes(self.weight_dtype)
        dtype_bytes(self.kv_dtype)

    # -- counts ------------------------------------------------------------------------------
    @property
    def num_lm_head_rows(self) -> int:
        return self.lm_head_size or self.vocab_size

    @property
    def num_layer_params(self) -> int:
        """Matmul weights of all L layers: L * (E(H + 2Hkv)D + HDE + 3EI), biases included."""
        e, d = self.hidden_size, self.head_dim
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * d
        attn = e * qkv_out + (qkv_out if self.qkv_bias else 0) + self.num_heads * d * e
        return self.num_layers * (attn + 3 * e * self.intermediate_size)

    @property
    def num_params(self) -> int:
        """All parameters (a tied LM head counted once; norm vectors included)."""
        e = self.hidden_size
        embed = self.vocab_size * e
        head = 0 if self.tie_word_embeddings and self.lm_head_size in (None, self.vocab_size) \
            else self.num_lm_head_rows * e
        norms = (2 * self.num_layers + 1) * e
        return embed + self.num_layer_params + head + norms

    @property
    def bytes_per_weight(self) -> float:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def weight_bytes(self) -> float:
        """Memory the weights occupy (bytes)."""
        return self.num_params * self.bytes_per_weight

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights one forward streams from memory: every layer matmul and the LM head (bytes).
        The embedding is a gather of N rows, costed per token by the cost model."""
        return (self.num_layer_params + self.num_lm_head_rows * self.hidden_size) * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token across all layers: 2 * L * Hkv * D * bytes (bytes)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[self.kv_dtype]

    def with_dtypes(self, weight_dtype: str | None = None, kv_dtype: str | None = None) -> "ModelSpec":
        """A copy stored in other dtypes (None keeps the current one)."""
        return replace(self, weight_dtype=weight_dtype or self.weight_dtype, kv_dtype=kv_dtype or self.kv_dtype)

    # -- conversions ----------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, cfg, name: str | None = None, weight_dtype: str = "bfloat16",
                       kv_dtype: str | None = None) -> "ModelSpec":
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
        return cls(
            name=name or get("name") or get("_name_or_path") or get("model_type") or "model",
            num_layers=get("num_hidden_layers"), hidden_size=get("hidden_size"),
            intermediate_size=get("intermediate_size"), num_heads=heads,
            num_kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads, vocab_size=get("vocab_size"),
            lm_head_size=get("lm_head_size"), tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            qkv_bias=bool(get("attention_bias", False)) or get("model_type") == "qwen2",
            max_position_embeddings=get("max_position_embeddings") or 4096,
            weight_dtype=weight_dtype, kv_dtype=kv_dtype or weight_dtype)

    @classmethod
    def from_model_config(cls, cfg, name: str = "model", dtype: str = "float32") -> "ModelSpec":
        """From minispec's own :class:`~minispec.models.llama.ModelConfig` (the live model's shape)."""
        return cls(name=name, num_layers=cfg.num_layers, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                   head_dim=cfg.head_dim, vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_word_embeddings,
                   qkv_bias=cfg.qkv_bias, max_position_embeddings=cfg.max_position_embeddings,
                   weight_dtype=dtype, kv_dtype=dtype)

    def to_model_config(self, max_position_embeddings: int | None = None):
        """A minispec ModelConfig of this shape (for random-weight models; the LM head covers V)."""
        from minispec.models.llama import ModelConfig

        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=self.num_layers,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           max_position_embeddings=max_position_embeddings or self.max_position_embeddings,
                           tie_word_embeddings=self.tie_word_embeddings, qkv_bias=self.qkv_bias)


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


def load_model_spec(name_or_path, weight_dtype: str = "bfloat16", kv_dtype: str | None = None) -> ModelSpec:
    """A ModelSpec from a preset name ("llama-3-8b", "random:llama-3-8b", an engine alias), a
    config.json path, a checkpoint directory holding config.json, a transformers config object or
    a dict, or an existing ModelSpec (re-stored in the given dtypes).

    Raises: ValueError for an unknown name, a missing file or an incomplete config.
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path.with_dtypes(weight_dtype, kv_dtype or weight_dtype)
    if not isinstance(name_or_path, (str, Path)):
        return ModelSpec.from_hf_config(name_or_path, weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    text = str(name_or_path).removeprefix("random:")
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        return ModelSpec.from_hf_config(json.loads(path.read_text()), name=path.parent.name or text,
                                        weight_dtype=weight_dtype, kv_dtype=kv_dtype)
    info = preset_info(text)
    return ModelSpec.from_hf_config(info["config"], name=info.get("name", text), weight_dtype=weight_dtype,
                                    kv_dtype=kv_dtype)


def random_model(name: str, device, dtype, seed: int = 0, max_len: int = 4096):
    """A random-weight LlamaModel with a preset's real shape, for timing a model not on disk.

    Returns (model, tokenizer, hf_config): the bundled tokenizer when the model's vocabulary covers
    it (so bench's text prompts work), else None; hf_config is None. The maximum length is capped
    at ``max_len`` so the default KV pool holds a request (shapes, not this cap, set step time).
    Raises: ValueError for an unknown preset.
    """
    import torch

    from minispec.models.llama import LlamaModel, rope_inv_freq

    spec = load_model_spec(name)
    cfg = spec.to_model_config(min(spec.max_position_embeddings, max_len))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.fill_(1.0)
            elif p.dim() == 2:
                p.normal_(0.0, p.shape[0] ** -0.5, generator=gen)
            else:
                p.zero_()
    model.inv_freq = rope_inv_freq(cfg).to(device)
    model = model.eval().requires_grad_(False)
    tokenizer = None
    if cfg.vocab_size >= BUNDLED_VOCAB_SIZE:
        from minispec.models.loader import BUNDLED_TARGET, load_tokenizer, resolve_model

        try:
            tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
        except ValueError:
            tokenizer = None
    return model, tokenizer, None
