"""Hardware specs for the roofline cost model: peak compute, memory bandwidth, memory size, and
the fixed times of the serving engine that runs on it.

A spec is a JSON file in data/hardware/ (``h100.json``, ..., and ``this.json`` once
``python -m minispec profile`` has fitted the current machine). Every number carries its source
in the file's ``sources`` table. Compute is the dense figure (no 2:4 sparsity): datasheets print
the sparse figure, twice the dense one, and a decoder's matmuls are dense.
The fixed times (per engine step, per forward, per draft forward) belong to the engine as much as
to the device: eager PyTorch, CUDA graphs and a megakernel differ by a millisecond per step on the
same GPU. So a spec names the ``engine_mode`` its overheads describe, and ``engine_modes`` holds
other measured modes; ``load_hardware("h100@megakernel")`` or :meth:`HardwareSpec.with_engine_mode`
swaps them in, each with its own sources.
Invariant: a loaded HardwareSpec has positive peaks and efficiencies in (0, 1], so every time the cost model
computes is finite and positive. Taught in notebooks/01_decode_is_memory_bound.ipynb and
notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

HARDWARE_DIR = Path(__file__).resolve().parents[2] / "data" / "hardware"
# what an engine mode may set: the fixed times, and the achievable fractions an engine's kernels reach
ENGINE_MODE_FIELDS = ("step_overhead_s", "forward_overhead_s", "draft_forward_overhead_s",
                      "request_overhead_s", "layer_overhead_s", "eager_layer_overhead_s", "graph_max_query",
                      "draft_request_overhead_s", "bandwidth_efficiency", "compute_efficiency", "overlap")


@dataclass
class HardwareSpec:
    """One accelerator (or the CPU this runs on), as the cost model sees it.

    Args:
        name: short key, e.g. "h100" (the file name without ``.json``).
        description: what it is, in words.
        dense_flops_per_s: peak dense matmul FLOP/s at ``flops_dtype`` (bf16 for GPUs).
        memory_bandwidth_bytes_per_s: peak memory (HBM / GDDR / DRAM) bandwidth, bytes/s.
        memory_bytes: device memory in bytes (weights + KV cache must fit).
        compute_efficiency: achievable fraction of ``dense_flops_per_s`` for the model's matmuls.
        bandwidth_efficiency: achievable fraction of the peak bandwidth when streaming weights/KV.
        step_overhead_s: fixed host time once per engine step (scheduling, input preparation,
            sampling, output processing), seconds; charged with the target forward.
        request_overhead_s: extra time per request in a forward (Python bookkeeping), seconds.
        overlap: how much of the shorter of compute and memory time hides under the longer one:
            1 is the roofline, max(compute, memory); 0 adds them (a CPU that cannot overlap).
        attention_efficiency: attention's achievable fraction of the matmul FLOP rate (1: alike).
        extra_weight_reads: passes over the weights beyond the first in a forward of 2+ tokens
            (CPU BLAS packs the weight matrix for a matrix-matrix product; 0 on GPUs).
        flops_dtype: the dtype the peak FLOP/s figure is for.
        device_type: torch's ``device.type`` of the device ("cuda", "cpu", ...): a simulated
            engine's KV pool evicts as a real one on that device does
            (``minispec.build.pool.memory_follows_use``: a CPU commits KV memory on first use).
        sources: field name -> where the number comes from.
        fit: ``profile``'s fit report (only for a profiled machine).
        forward_overhead_s: fixed time per target forward beyond the roofline (kernel launches,
            CUDA-graph replay, an eager engine's per-layer Python), seconds.
        draft_forward_overhead_s: the same for each forward of a drafter (a draft model or head);
            None means ``forward_overhead_s``. Engines run their draft loops differently from the
            target (vLLM 0.10's EAGLE proposer prepares inputs in Python at every draft step).
        engine_mode: the engine the overheads describe, e.g. "vllm-0.10-cuda-graphs".
        engine_modes: other measured modes: name -> {"description", any of ENGINE_MODE_FIELDS,
            "sources": {field: citation}}; see :meth:`with_engine_mode`.
        interconnect_bandwidth_bytes_per_s: GPU-to-GPU bandwidth one way (NVLink, Infinity
            Fabric), for tensor-parallel all-reduces; None when not known.
        allreduce_latency_s: fixed time of one small all-reduce between GPUs of one node; None
            when not known (tensor parallelism is then refused).
        layer_overhead_s: fixed time per decoder layer of every forward (target or draft), seconds:
            the floor a layer's few dozen small kernels set whatever their bytes (a GPU runs each
            kernel for some microseconds; an eager engine adds Python's launch of each). It makes
            a forward's fixed time grow with the model's depth: a 16-layer draft pays 16 of them.
        eager_layer_overhead_s: the same for a forward that cannot replay a CUDA graph (a run of
            more than ``graph_max_query`` tokens: a prompt chunk); None = ``layer_overhead_s``.
        graph_max_query: the longest run of one request a graph replays (minispec's
            GraphModelRunner: 32); None = every forward is charged ``layer_overhead_s``.
        draft_request_overhead_s: per request in each draft forward, seconds (a drafter's own host
            work per request: building its tree, picking its tokens); None = ``request_overhead_s``.
    Raises:
        ValueError: for a non-positive peak or memory, an efficiency outside (0, 1], or an empty
            device type.
    """

    name: str
    description: str
    dense_flops_per_s: float
    memory_bandwidth_bytes_per_s: float
    memory_bytes: float
    compute_efficiency: float = 0.7
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.0
    request_overhead_s: float = 0.0
    overlap: float = 1.0
    attention_efficiency: float = 1.0
    extra_weight_reads: float = 0.0
    flops_dtype: str = "bfloat16"
    default_dtype: str = "bfloat16"
    device_type: str = "cuda"
    sources: dict = field(default_factory=dict)
    fit: dict | None = None
    forward_overhead_s: float = 0.0
    draft_forward_overhead_s: float | None = None
    engine_mode: str | None = None
    engine_modes: dict = field(default_factory=dict)
    interconnect_bandwidth_bytes_per_s: float | None = None
    allreduce_latency_s: float | None = None
    layer_overhead_s: float = 0.0
    eager_layer_overhead_s: float | None = None
    graph_max_query: int | None = None
    draft_request_overhead_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("dense_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_bytes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be a number > 0")
        for name in ("compute_efficiency", "bandwidth_efficiency", "attention_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be in (0, 1]")
        for name in ("step_overhead_s", "request_overhead_s", "extra_weight_reads", "forward_overhead_s",
                     "layer_overhead_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be a number >= 0")
        for name in ("draft_forward_overhead_s", "interconnect_bandwidth_bytes_per_s", "allreduce_latency_s",
                     "eager_layer_overhead_s", "draft_request_overhead_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be None or a number >= 0")
        for mode, entry in self.engine_modes.items():
            unknown = set(entry) - set(ENGINE_MODE_FIELDS) - {"description", "sources"}
            if unknown:
                raise ValueError(f"hardware {self.name!r}: engine mode {mode!r} has unknown field(s) "
                                 f"{', '.join(sorted(unknown))}; allowed: {', '.join(ENGINE_MODE_FIELDS)}")
        if (self.graph_max_query is not None
                and (not isinstance(self.graph_max_query, int) or self.graph_max_query < 1)):
            raise ValueError(f"hardware {self.name!r}: graph_max_query={self.graph_max_query!r} must be None "
                             "or an integer >= 1")
        if not isinstance(self.overlap, (int, float)) or not 0 <= self.overlap <= 1:
            raise ValueError(f"hardware {self.name!r}: overlap={self.overlap!r} must be in [0, 1]")
        if not isinstance(self.device_type, str) or not self.device_type:
            raise ValueError(f"hardware {self.name!r}: device_type={self.device_type!r} must be torch's "
                             "device type, e.g. 'cuda' or 'cpu'")

    @property
    def effective_flops_per_s(self) -> float:
        """FLOP/s the cost model charges compute at (peak x efficiency)."""
        return self.dense_flops_per_s * self.compute_efficiency

    @property
    def effective_bandwidth_bytes_per_s(self) -> float:
        """Bytes/s the cost model charges memory traffic at (peak x efficiency)."""
        return self.memory_bandwidth_bytes_per_s * self.bandwidth_efficiency

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which a step is compute-bound (Williams et al.
        2009, roofline)."""
        return self.effective_flops_per_s / self.effective_bandwidth_bytes_per_s

    def layer_time_s(self, num_layers: int, max_query: int = 1) -> float:
        """Fixed seconds of a forward's ``num_layers`` layers: eager when a run is longer than
        ``graph_max_query`` tokens, else replayed (``layer_overhead_s`` each)."""
        eager = self.graph_max_query is not None and max_query > self.graph_max_query
        per_layer = self.eager_layer_overhead_s if eager and self.eager_layer_overhead_s is not None \
            else self.layer_overhead_s
        return per_layer * num_layers

    @property
    def draft_overhead_s(self) -> float:
        """Fixed seconds of one draft forward (``draft_forward_overhead_s``, else the target's)."""
        return (self.forward_overhead_s if self.draft_forward_overhead_s is None
                else self.draft_forward_overhead_s)

    def with_engine_mode(self, mode: str) -> "HardwareSpec":
        """This device under another measured engine mode: its overheads (and any efficiency the
        mode measured) replace this spec's, with the mode's sources.

        Raises: ValueError for a mode this spec does not list (the message lists the known ones).
        """
        if mode == self.engine_mode:
            return self
        if mode not in self.engine_modes:
            known = ", ".join([m for m in [self.engine_mode] if m] + sorted(self.engine_modes)) or "none"
            raise ValueError(f"hardware {self.name!r} has no engine mode {mode!r}: choose one of {known}")
        entry = self.engine_modes[mode]
        values = {k: v for k, v in entry.items() if k in ENGINE_MODE_FIELDS}
        if "step_overhead_s" in values and "draft_forward_overhead_s" not in values:
            values["draft_forward_overhead_s"] = None  # a mode that does not say keeps no stale draft figure
        modes = dict(self.engine_modes)
        if self.engine_mode and self.engine_mode not in modes:  # keep the way back to the current mode
            modes[self.engine_mode] = {**{k: getattr(self, k) for k in ENGINE_MODE_FIELDS},
                                       "sources": {k: self.sources[k] for k in ENGINE_MODE_FIELDS
                                                   if k in self.sources}}
        return replace(self, **values, engine_mode=mode, engine_modes=modes,
                       sources={**self.sources, **entry.get("sources", {})})

    def with_overheads(self, step_overhead_s: float | None = None, forward_overhead_s: float | None = None,
                       draft_forward_overhead_s: float | None = None) -> "HardwareSpec":
        """A copy with other fixed times (seconds; None keeps the current value), marked as a
        what-if: its engine mode becomes "<mode> (edited)" (what notebook 05's overhead slider uses).

        Raises: ValueError for a negative time.
        """
        values = {k: v for k, v in (("step_overhead_s", step_overhead_s),
                                    ("forward_overhead_s", forward_overhead_s),
                                    ("draft_forward_overhead_s", draft_forward_overhead_s)) if v is not None}
        return replace(self, **values, engine_mode=f"{self.engine_mode or 'unnamed'} (edited)")

    def to_dict(self) -> dict:
        return asdict(self)


def available_hardware() -> list[str]:
    """Names of the specs in data/hardware/ (``this`` only once profiled)."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def load_hardware(name_or_path: str | Path, engine_mode: str | None = None) -> HardwareSpec:
    """A HardwareSpec from a name in data/hardware/ ("h100", "this", ...) or a JSON file path,
    under its default engine mode, or under ``engine_mode`` (also spelled "h100@megakernel").

    Raises:
        ValueError: unknown name or missing file (the message lists the known names; for
            "this" it says to run ``python -m minispec profile`` first), a bad field, or an
            engine mode the file does not list.
    """
    text = str(name_or_path)
    if "@" in text and not text.endswith(".json"):
        text, mode = text.split("@", 1)
        if engine_mode is not None and engine_mode != mode:
            raise ValueError(f"hardware {name_or_path!r} names engine mode {mode!r} but "
                             f"engine_mode={engine_mode!r}")
        engine_mode = mode
    path = Path(text) if text.endswith(".json") else HARDWARE_DIR / f"{text.lower()}.json"
    if not path.exists():
        if text == "this":
            raise ValueError("hardware 'this' is not profiled yet: run `python -m minispec profile` "
                             "to measure this machine (it writes data/hardware/this.json)")
        raise ValueError(f"hardware {text!r} is unknown: choose one of {', '.join(available_hardware())} "
                         "or give a JSON file path")
    data = json.loads(path.read_text())
    known = set(HardwareSpec.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path.name}: unknown field(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(known))}")
    spec = HardwareSpec(**data)
    return spec if engine_mode is None else spec.with_engine_mode(engine_mode)


def save_hardware(spec: HardwareSpec, path: str | Path) -> None:
    """Write ``spec`` as JSON (what ``profile`` does for this machine)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(spec.to_dict(), indent=1) + "\n")
