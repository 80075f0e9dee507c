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
- weights: "float32", "bfloat16" (half the bytes), "int8" (weight-only: symmetric int8, one scale
  per output channel, activations stay float) or "int8-dynamic" (int8 weights and activations).
  PyTorch's CPU kernel for weight-only int8 (``aten._weight_int8pack_mm``) is 5-40x slower than
  the float32 product on the course machine, so "int8" runs the int8-rounded weights through the
  float32 kernels: the numbers of int8 weights, not their speed (a GPU's kernel reads a quarter of
  the bytes; the simulator models that). "int8-dynamic" is the fast one: fbgemm's dynamic int8
  linear (``torch.ops.quantized.linear_dynamic``) quantizes each step's activations on the fly
  (one scale per call, 7 bits on x86), and SmolLM2's activation outliers make it lossy: measure
  its agreement with float32 before serving with it (tests/test_kernels.py, bench/compare_hf.py).
  That shared scale also makes a row's numbers depend on the rows beside it in the step, so
  with int8-dynamic neither continuous batching nor speculation is exact, only close.
Fast kernels agree with the reference to float32 rounding. Invariant: preparing never changes
the model's own weights, so engines with different choices can share one model.
Taught in notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass, field

import torch

KERNELS = ("fast", "reference")
WEIGHT_FORMATS = ("float32", "bfloat16", "int8", "int8-dynamic")
BYTES_PER_WEIGHT = {"float32": 4, "bfloat16": 2, "int8": 1, "int8-dynamic": 1}
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # per-layer weights a runner prepares


@dataclass
class PreparedLinear:
    """One weight made ready for a kernel. kind: "onednn" (a oneDNN-packed tensor), "plain" (a
    [in, out] tensor in another dtype, used with ``@``), "int8" (fbgemm packed parameters), or
    "fake-int8" (dequantized int8 weights [in, out]; the activations are rounded as fbgemm does)."""

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
    if kind == "int8":
        rows = x.reshape(-1, x.shape[-1]).float()
        out = torch.ops.quantized.linear_dynamic(rows, w, True)
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
    if kind == "fake-int8":
        return (round_activations(x.float()) @ w).to(x.dtype)
    return (x.to(w.dtype) @ w).to(x.dtype)


def round_activations(x: torch.Tensor) -> torch.Tensor:
    """x rounded as fbgemm's dynamic int8 linear rounds it: one asymmetric scale for the whole
    tensor, 7 bits (0..127, the x86 "reduce_range" that keeps its int16 sums from saturating)."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = max((hi - lo) / 127.0, 1e-12)
    zero_point = int(min(max(round(-lo / scale), 0), 127))
    return torch.fake_quantize_per_tensor_affine(x, scale, zero_point, 0, 127)


def split_matvec(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One row x [..., in] times weight [in, out], split over the CPU threads: the same as x @ weight.

    MKL computes a matrix-vector product on one core, so a batch-1 decode streams the weights at
    one core's bandwidth. Viewed as P column blocks ([P, in, out/P], a view: no copy), the same
    product is a batched matmul that torch runs one block per thread, so all P cores stream their
    share; each output column is the same dot product as before. The BLAS may sum it in another
    order in its batched kernel: bit for bit on the AMD host the course was measured on, equal to
    float32 rounding on an AVX-512 Xeon (tests/test_model.py holds it to the worst-case bound).
    bench/compare_hf.py measures the batch-1 decode it serves.
    """
    parts, n = torch.get_num_threads(), weight.shape[-1]
    if parts < 2 or n % parts or x.device.type != "cpu" or not weight.is_contiguous():
        return x @ weight
    blocks = weight.view(weight.shape[0], parts, n // parts).transpose(0, 1)       # [P, in, out/P]
    out = torch.bmm(x.reshape(1, 1, -1).expand(parts, 1, -1), blocks)              # [P, 1, out/P]
    return out.reshape(*x.shape[:-1], n)


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output channel: weight [in, out] float ->
    (q [out, in] int8, scales [out] float32), weight ~= (q * scales[:, None]).T."""
    w = weight.detach().float().T                                                   # [out, in]
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


@torch.no_grad()
def prepare_linear(weight: torch.Tensor, kernels: str, weights: str) -> PreparedLinear | None:
    """``weight`` [in, out] made ready for ``kernels`` with ``weights`` storage (see module doc).
    Returns None for the reference kernels at the weight's own float32 dtype (plain ``x @ W``)."""
    on_cpu = weight.device.type == "cpu"
    if weights in ("int8", "int8-dynamic"):
        q, scales = int8_per_channel(weight)
        rounded = (q.float() * scales[:, None]).T.contiguous().to(weight.device)         # [in, out]
        if weights == "int8":  # weight-only: the float32 kernels over int8-rounded weights
            return prepare_linear(rounded, kernels, "float32") or PreparedLinear("plain", rounded)
        if kernels == "reference":
            return PreparedLinear("fake-int8", rounded)
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; fbgemm's kernel is current
            warnings.simplefilter("ignore")
            qw = torch.quantize_per_channel(q.float() * scales[:, None], scales.double(),
                                            torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)
            return PreparedLinear("int8", torch.ops.quantized.linear_prepack(qw, None))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[weights]
    if kernels == "fast" and on_cpu and (dtype == torch.float32 or onednn_bf16_supported()):
        # oneDNN takes the [out, in] layout; 16 is the row count its blocking is tuned for
        return PreparedLinear("onednn", torch.ops.mkldnn._reorder_linear_weight(weight.T.to(dtype).contiguous(), 16))
    if dtype == weight.dtype:
        return None
    return PreparedLinear("plain", weight.to(dtype).contiguous())


def onednn_bf16_supported() -> bool:
    """True when oneDNN can pack bfloat16 weights on this CPU (it needs AVX512-BF16-class
    instructions); elsewhere bfloat16 weights multiply through ``@``, which emulates bfloat16."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def check_kernels(kernels: str, weights: str, device: torch.device) -> None:
    """Raise ValueError for a choice this device or torch build cannot run."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels={kernels!r}: choose one of {', '.join(KERNELS)}")
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"weights={weights!r}: choose one of {', '.join(WEIGHT_FORMATS)}")
    if device.type == "cpu" and kernels == "fast" and not torch.backends.mkldnn.is_available():
        raise ValueError("fast kernels on CPU need a torch built with oneDNN (mkldnn): use kernels='reference'")
    if weights == "int8-dynamic" and kernels == "fast":
        if device.type != "cpu" or "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError(f"int8-dynamic weights need fbgemm on CPU; this is {device.type} with quantized engines "
                             f"{torch.backends.quantized.supported_engines}: use kernels='reference' or other weights")


# model -> {(kernels, weights, weights' fingerprint): PreparedWeights}. Weak keys: the copies go
# when the model goes. Every engine built on one loaded model shares one packed copy per choice
# (a notebook builds a dozen engines; each used to hold its own 540 MB copy).
_PREPARED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, PreparedWeights]]" = weakref.WeakKeyDictionary()


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


def _prepare(model, kernels: str, weights: str) -> PreparedWeights:
    """Make the copies :func:`prepare_weights` shares."""
    layers = [{name: prepare_linear(getattr(layer, name), kernels, weights) for name in PROJECTIONS}
              for layer in model.layers]
    extra = {name: prepare_linear(getattr(model, name), kernels, weights) for name in getattr(model, "EXTRA_LINEAR", ())}
    return PreparedWeights(layers, prepare_linear(model.lm_head, kernels, weights), extra, weights)
