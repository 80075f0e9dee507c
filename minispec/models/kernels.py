"""How a linear layer runs: the plain product (the reference), or faster kernels PyTorch ships.

Every projection of the model is ``x [..., in] @ W [in, out]``. Decode at small batch reads every
weight once per step and does little arithmetic on it, so its speed is set by bytes read and by
how well the kernel streams them. Two choices, made once per ModelRunner (``prepare_weights``):
- kernels: "reference" keeps ``x @ W``, the readable path every equivalence test checks;
  "fast" uses oneDNN's pre-packed weights on CPU, whose blocked kernel multiplies 2 to 32 rows
  about as fast as one (MKL behind ``@`` takes 2-3x longer there, so a (k + 1)-token verify
  would cost 2-3 decodes instead of about one, as the memory-bound picture says it should).
  One row (a batch-1 decode) takes the same kernel: over the 121 weights of the bundled model it
  streamed them in 18-23 ms against 29-33 ms for the thread-split product the reference uses.
- weights: "float32", "bfloat16" (half the bytes), "int8" (symmetric int8, one scale per output
  channel) or "int4" (4-bit codes with a bfloat16 scale and zero per group of 32 inputs: the
  bundled checkpoint's own Q4_1 codes, about 0.625 bytes per weight, and the LM head in int8).
  Both low-bit formats run PyTorch's weight-only CPU kernels (``aten._weight_int8pack_mm``,
  ``aten._weight_int4pack_mm_for_cpu``) with bfloat16 activations: minispec/models/lowbit.py.
  On the reference kernels (and off the CPU) they multiply the activations by the dequantized
  weights: the numbers of the low-bit weights through the plain product the equivalence tests
  check, not their bytes (the simulator models a GPU's low-bit kernels).
Fast kernels agree with the reference to float32 rounding (the low-bit ones to their bfloat16
activations; docs/cost_model.md, section 10, measures int4). Invariant: preparing never changes
the model's own weights, so engines with different choices can share one model.
Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass, field

import torch

from minispec.models import lowbit

KERNELS = ("fast", "reference")
WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "int4")
BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2, **lowbit.BYTES_PER_WEIGHT}
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # per-layer weights a runner prepares


@dataclass
class PreparedLinear:
    """One weight made ready for a kernel. kind: "onednn" (a oneDNN-packed tensor), "plain" (a
    [in, out] tensor in another dtype, used with ``@``), "int8" or "int4" (lowbit.Int8Weight,
    lowbit.Int4Weight for PyTorch's weight-only kernels)."""

    kind: str
    weight: object


@dataclass
class PreparedWeights:
    """A runner's copies of a model's weights for its kernels: per layer the four projections, the
    LM head, and extra projections of a model that has them (an EAGLE head's ``fc``)."""

    layers: list[dict[str, PreparedLinear]]
    lm_head: PreparedLinear | None
    extra: dict[str, PreparedLinear] = field(default_factory=dict)
    weights: str = "float32"


def linear(x: torch.Tensor, weight: torch.Tensor, prepared: PreparedLinear | None = None) -> torch.Tensor:
    """x [..., in] @ weight [in, out] -> [..., out] in x's dtype, through ``prepared`` when given.

    Without ``prepared`` (the reference kernels at the model's own dtype): one row (a batch-1
    decode) goes through :func:`split_matvec`, more rows through ``@``.
    """
    if prepared is None:
        return split_matvec(x, weight) if x.numel() == x.shape[-1] else x @ weight
    kind, w = prepared.kind, prepared.weight
    if kind == "onednn":
        if w.dtype == x.dtype:  # the common case: no cast in or out (two dispatches fewer per product)
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise(x.to(w.dtype), w, None, "none", [], "").to(x.dtype)
    if kind == "int4":
        return lowbit.int4_linear(x, w)
    if kind == "int8":
        return lowbit.int8_linear(x, w)
    return (x.to(w.dtype) @ w).to(x.dtype)


def split_matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One row x [..., in] times weight [in, out], split over the CPU threads: the same as x @ weight.

    MKL computes a matrix-vector product on one core, so a batch-1 decode streams the weights at
    one core's bandwidth. Viewed as P column blocks ([P, in, out/P], a view: no copy), the same
    product is a batched matmul that torch runs one block per thread, so all P cores stream their
    share; each output column is the same dot product as before. The BLAS may sum it in another
    order in its batched kernel: bit for bit on the AMD host the course was measured on, equal to
    float32 rounding on an AVX-512 Xeon (tests/test_model.py holds it to the worst-case bound).
    bench/peers/compare_hf.py measures the batch-1 decode it serves.
    """
    parts, n = torch.get_num_threads(), weight.shape[-1]
    if parts < 2 or n % parts or x.device.type != "cpu" or not weight.is_contiguous():
        return x @ weight
    blocks = weight.view(weight.shape[0], parts, n // parts).transpose(0, 1)       # [P, in, out/P]
    out = torch.bmm(x.reshape(1, 1, -1).expand(parts, 1, -1), blocks)              # [P, 1, out/P]
    return out.reshape(*x.shape[:-1], n)


@torch.no_grad()
def prepare_linear(weight: torch.Tensor, kernels: str,
                   weights: str, head: bool = False) -> PreparedLinear | None:
    """``weight`` [in, out] made ready for ``kernels`` with ``weights`` storage (see module doc);
    ``head``: the LM head, which "int4" keeps in int8 (the bundled file ships it as 8-bit Q8_0).
    Returns None for the reference kernels at the weight's own float32 dtype (plain ``x @ W``)."""
    on_cpu = weight.device.type == "cpu"
    if weights == "int4" and head:
        weights = "int8"
    if weights in ("int8", "int4"):
        if kernels == "reference" or not on_cpu:  # the low-bit numbers through the plain product
            dequantize = lowbit.dequantize_int4 if weights == "int4" else _int8_reference
            return PreparedLinear("plain", dequantize(weight).to(device=weight.device, dtype=weight.dtype))
        quantize = lowbit.quantize_int4 if weights == "int4" else lowbit.quantize_int8
        return PreparedLinear(weights, quantize(weight))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[weights]
    if kernels == "fast" and on_cpu and (dtype == torch.float32 or onednn_bf16_supported()):
        # oneDNN takes the [out, in] layout; 16 is the row count its blocking is tuned for
        return PreparedLinear("onednn",
                              torch.ops.mkldnn._reorder_linear_weight(weight.T.to(dtype).contiguous(), 16))
    if dtype == weight.dtype:
        return None
    return PreparedLinear("plain", weight.to(dtype).contiguous())


def onednn_bf16_supported() -> bool:
    """True when oneDNN can pack bfloat16 weights on this CPU (it needs AVX512-BF16-class
    instructions); elsewhere bfloat16 weights multiply through ``@``, which emulates bfloat16."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def onednn_available() -> bool:
    """True when this torch build has oneDNN (mkldnn); macOS arm64 and some other builds do not.
    ``MINISPEC_ONEDNN=off`` reports it missing, so any machine can run the path those builds take."""
    return os.environ.get("MINISPEC_ONEDNN", "on") != "off" and bool(torch.backends.mkldnn.is_available())


def format_support(device: torch.device) -> dict[str, str]:
    """How each weight format runs on ``device``: "native", or "emulated: why" (it runs, slower
    than its bytes promise), or "unavailable: why" (refused). On a CPU: bfloat16 math needs
    AVX512-BF16 or AMX (oneDNN's probe), the low-bit kernels AVX2 or better and take bfloat16
    activations. Off the CPU the low-bit formats multiply by dequantized weights (module doc)."""
    if device.type != "cpu":
        return {f: "native" if f in ("float32", "bfloat16") else "emulated: dequantized weights, not "
                "their bytes (PyTorch's weight-only kernels here are CPU kernels)" for f in WEIGHT_FORMATS}
    bf16 = onednn_available() and onednn_bf16_supported()
    no_bf16 = "this CPU has no AVX512-BF16 or AMX, so bfloat16 math converts through float32"
    lowbit_ok = torch.backends.cpu.get_cpu_capability().startswith("AVX")
    support = {"float32": "native", "bfloat16": "native" if bf16 else f"emulated: {no_bf16}"}
    for f in ("int8", "int4"):
        support[f] = ("unavailable: PyTorch's kernel needs AVX2 or AVX-512" if not lowbit_ok
                      else "native" if bf16 else f"emulated: its activations are bfloat16, and {no_bf16}")
    return support


_FELL_BACK = []  # the one warning that fast kernels fell back to the reference, once per process


def effective_kernels(kernels: str, device: torch.device) -> str:
    """The kernels that run: "fast" falls back to "reference" on a CPU whose torch has no oneDNN,
    with one warning line per process (the machine card says so too)."""
    if kernels == "fast" and device.type == "cpu" and not onednn_available():
        if not _FELL_BACK:
            _FELL_BACK.append(True)
            logging.getLogger("minispec").warning(
                "kernels: this torch build has no oneDNN, so the fast kernels fall back to the reference "
                "x @ W (every result holds; verify steps cost more rows' time)")
        return "reference"
    return kernels


def check_kernels(kernels: str, weights: str, device: torch.device) -> None:
    """Raise ValueError for a choice this device or torch build cannot run."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}: choose one of {', '.join(KERNELS)}")
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if weights in ("int8", "int4") and kernels == "fast":
        lowbit.check_lowbit(weights, device)


# model -> {(kernels, weights, weights' fingerprint): PreparedWeights}. Weak keys: the copies go
# when the model goes. Every engine built on one loaded model shares one packed copy per choice
# (a notebook builds a dozen engines; each used to hold its own 540 MB copy).
_PREPARED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, PreparedWeights]]" = (
    weakref.WeakKeyDictionary())


def prepare_weights(model, kernels: str, weights: str) -> PreparedWeights | None:
    """A ModelRunner's copies of ``model``'s projections and LM head for ``kernels`` and ``weights``
    (the embedding stays as it is: a decode gathers one row of it). Returns None when the model's
    own weights serve as they are (reference kernels, weights in the model's dtype).

    Runners of the same model and choice share one copy, made again when a weight has changed
    since (its tensor or its in-place version counter, as training changes it): the copies are
    read-only, so sharing them changes no result.

    Raises: ValueError for a choice ``check_kernels`` refuses.
    """
    check_kernels(kernels, weights, model.lm_head.device)
    kernels = effective_kernels(kernels, model.lm_head.device)
    if kernels == "reference" and weights == str(model.lm_head.dtype).removeprefix("torch."):
        return None
    key = (kernels, weights, tuple((p.data_ptr(), p._version) for p in model.parameters()))
    shared = _PREPARED.setdefault(model, {})
    if key not in shared:
        # a changed weight makes the older copies stale: drop them
        for old in [k for k in shared if k[:2] == key[:2]]:
            del shared[old]
        shared[key] = _prepare(model, kernels, weights)
    return shared[key]


def _int8_reference(weight: torch.Tensor) -> torch.Tensor:
    """The float32 [in, out] weight "int8" stands for (codes times their per-channel scale)."""
    return lowbit.dequantize_int8(lowbit.quantize_int8(weight))


def weight_bytes_per_token(prepared: PreparedWeights | None, model) -> int:
    """Bytes of weights a batch-1 decode step reads: every projection and the LM head as the runner
    stores them, plus one embedding row (a decode gathers one). The start-up line prints it."""
    def size(p: PreparedLinear | None, plain: torch.Tensor) -> int:
        if p is None:
            return plain.numel() * plain.element_size()
        if p.kind in ("int4", "int8"):
            return p.weight.num_bytes
        if p.kind == "plain":
            return p.weight.numel() * p.weight.element_size()
        return plain.numel() * (2 if prepared.weights == "bfloat16" else 4)  # oneDNN's packed copy
    total = model.embed_tokens[0].numel() * model.embed_tokens.element_size()
    for i, layer in enumerate(model.layers):
        total += sum(size(prepared.layers[i][name] if prepared else None, getattr(layer, name))
                     for name in PROJECTIONS)
    total += sum(size(prepared.extra.get(name) if prepared else None, getattr(model, name))
                 for name in getattr(model, "EXTRA_LINEAR", ()))
    return total + size(prepared.lm_head if prepared else None, model.lm_head)


def release_weights(model, kernels: str, weights: str) -> None:
    """Forget the shared copy of ``model``'s weights for ``kernels`` and ``weights`` (its memory
    goes once no runner holds it; the next runner that asks makes it again). A notebook that
    times one format after another keeps one extra copy at a time this way."""
    shared = _PREPARED.get(model, {})
    for key in [k for k in shared if k[:2] == (kernels, weights)]:
        del shared[key]


def _prepare(model, kernels: str, weights: str) -> PreparedWeights:
    """Make the copies :func:`prepare_weights` shares."""
    layers = [{name: prepare_linear(getattr(layer, name), kernels, weights) for name in PROJECTIONS}
              for layer in model.layers]
    extra = {name: prepare_linear(getattr(model, name), kernels, weights)
             for name in getattr(model, "EXTRA_LINEAR", ())}
    return PreparedWeights(layers, prepare_linear(model.lm_head, kernels, weights, head=True), extra, weights)
