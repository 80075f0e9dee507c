"""How a model is stored, for the cost model: its shape plus bytes per weight and per KV element.

The shape is minispec's one :class:`~minispec.models.config.ModelConfig` (the same the live model
is built from); ``weight_dtype`` and ``kv_dtype`` say how many bytes each weight and each cached K/V
element take, so a quantized checkpoint simply reads fewer bytes per weight.
Invariant: every count comes from the shape (models/config.py), never typed in twice.
Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from minispec.models.config import ModelConfig, available_models, load_model_config, preset_info

__all__ = ["DTYPE_BYTES", "ModelSpec", "available_models", "dtype_bytes", "load_model_spec", "preset_info"]

# bytes per stored element; int4 packs two weights per byte (scales and zero points ignored)
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of ``dtype``. Raises ValueError for an unknown name."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is unknown: choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


@dataclass(frozen=True, kw_only=True)
class ModelSpec(ModelConfig):
    """A model's shape (:class:`~minispec.models.config.ModelConfig`) plus how it is stored:
    ``weight_dtype`` and ``kv_dtype`` (see ``DTYPE_BYTES``), enough to cost a step.

    A draft head (minispec/sim/drafters.py) adds two counts a plain decoder does not have:
    ``extra_weights``, matmul weights every forward streams beyond the L layers and the LM head
    (EAGLE's fc projection of target features, EAGLE-3's QKV over a doubled input), and
    ``shared_params``, parameters it reads from the target's own copy (the embedding, an MTP
    head's or EAGLE-1's LM head), which take no memory of their own.

    Raises:
        ValueError: as ModelConfig, or for an unknown dtype.
    """

    max_position_embeddings: int = 4096
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    extra_weights: int = 0
    shared_params: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        dtype_bytes(self.weight_dtype)
        dtype_bytes(self.kv_dtype)
        for name in ("extra_weights", "shared_params"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"model {self.name!r}: {name}={value!r} must be an integer >= 0")

    @classmethod
    def of(cls, config: ModelConfig, weight_dtype: str = "bfloat16",
           kv_dtype: str | None = None) -> "ModelSpec":
        """``config`` stored in ``weight_dtype`` (KV in ``kv_dtype``, default the weights' dtype)."""
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(ModelConfig)}
        return cls(**fields, weight_dtype=weight_dtype, kv_dtype=kv_dtype or weight_dtype)

    @property
    def bytes_per_weight(self) -> float:
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def weight_bytes(self) -> float:
        """Memory the weights occupy (bytes): all parameters and ``extra_weights``, less those
        shared with the target."""
        return (self.num_params + self.extra_weights - self.shared_params) * self.bytes_per_weight

    @property
    def num_matmul_weights_per_token(self) -> int:
        """Matmul weights one token passes through below the LM head (2 FLOPs each)."""
        return self.num_layer_params + self.extra_weights

    @property
    def weight_bytes_per_step(self) -> float:
        """Weights one forward streams from memory (bytes): ``num_weights_per_step`` and
        ``extra_weights``."""
        return (self.num_weights_per_step + self.extra_weights) * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token across all layers (bytes)."""
        return self.kv_elements_per_token * DTYPE_BYTES[self.kv_dtype]

    def with_dtypes(self, weight_dtype: str | None = None, kv_dtype: str | None = None) -> "ModelSpec":
        """A copy stored in other dtypes (None keeps the current one)."""
        return replace(self, weight_dtype=weight_dtype or self.weight_dtype,
                       kv_dtype=kv_dtype or self.kv_dtype)


def load_model_spec(name_or_path, weight_dtype: str = "bfloat16", kv_dtype: str | None = None) -> ModelSpec:
    """A ModelSpec from anything :func:`~minispec.models.config.load_model_config` takes, or an
    existing ModelSpec (re-stored in the given dtypes).

    Raises: ValueError for an unknown name, a missing file, an incomplete config or an unknown dtype.
    """
    if isinstance(name_or_path, ModelSpec):
        return name_or_path.with_dtypes(weight_dtype, kv_dtype or weight_dtype)
    return ModelSpec.of(load_model_config(name_or_path), weight_dtype, kv_dtype)
