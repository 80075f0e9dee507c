"""Hardware specs for the roofline cost model: peak compute, memory bandwidth, memory size.

A spec is a JSON file in data/hardware/ (``h100.json``, ..., and ``this.json`` once
``python -m minispec profile`` has fitted the current machine). Every number carries its source
in the file's ``sources`` table. Compute is the dense figure (no 2:4 sparsity): datasheets print
the sparse figure, twice the dense one, and a decoder's matmuls are dense.
Invariant: a loaded HardwareSpec has positive peaks and efficiencies in (0, 1], so every time the
cost model computes is finite and positive. Taught in notebooks/01_decode_is_memory_bound.ipynb and notebooks/05_messenger_vs_truck.ipynb.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

HARDWARE_DIR = Path(__file__).resolve().parents[2] / "data" / "hardware"


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
        step_overhead_s: fixed time per forward (launches, scheduling, sampling), seconds.
        request_overhead_s: extra time per request in a step (Python bookkeeping), seconds.
        overlap: how much of the shorter of compute and memory time hides under the longer one:
            1 is the roofline, max(compute, memory); 0 adds them (a CPU that cannot overlap).
        attention_efficiency: attention's achievable fraction of the matmul FLOP rate (1: alike).
        extra_weight_reads: passes over the weights beyond the first in a forward of 2+ tokens
            (CPU BLAS packs the weight matrix for a matrix-matrix product; 0 on GPUs).
        flops_dtype: the dtype the peak FLOP/s figure is for.
        device_type: torch's ``device.type`` of the device ("cuda", "cpu", ...): a simulated
            engine's KV pool evicts as a real one on that device does
            (``minispec.kv_cache.memory_follows_use``: a CPU commits KV memory on first use).
        sources: field name -> where the number comes from.
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
    fit: dict | None = None  # profile's fit report (only for a profiled machine)

    def __post_init__(self) -> None:
        for name in ("dense_flops_per_s", "memory_bandwidth_bytes_per_s", "memory_bytes"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be a number > 0")
        for name in ("compute_efficiency", "bandwidth_efficiency", "attention_efficiency"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be in (0, 1]")
        for name in ("step_overhead_s", "request_overhead_s", "extra_weight_reads"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"hardware {self.name!r}: {name}={value!r} must be a number >= 0")
        if not isinstance(self.overlap, (int, float)) or not 0 <= self.overlap <= 1:
            raise ValueError(f"hardware {self.name!r}: overlap={self.overlap!r} must be in [0, 1]")
        if not isinstance(self.device_type, str) or not self.device_type:
            raise ValueError(f"hardware {self.name!r}: device_type={self.device_type!r} must be torch's device "
                             "type, e.g. 'cuda' or 'cpu'")

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

    def to_dict(self) -> dict:
        return asdict(self)


def available_hardware() -> list[str]:
    """Names of the specs in data/hardware/ (``this`` only once profiled)."""
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """A HardwareSpec from a name in data/hardware/ ("h100", "this", ...) or a JSON file path.

    Raises:
        ValueError: unknown name or missing file (the message lists the known names; for
            "this" it says to run ``python -m minispec profile`` first), or a bad field.
    """
    text = str(name_or_path)
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
    return HardwareSpec(**data)


def save_hardware(spec: HardwareSpec, path: str | Path) -> None:
    """Write ``spec`` as JSON (what ``profile`` does for this machine)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(spec.to_dict(), indent=1) + "\n")
