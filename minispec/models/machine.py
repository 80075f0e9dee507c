"""The machine card: what this machine is and what the engine can run on it natively.

One card, printed by the course's ``setup()`` (notebook 00 onwards), ``python -m minispec info`` and
``generate -v``: the CPU (or GPU) and its core count, the threads torch uses, ATen's CPU capability
(``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...), whether this torch has oneDNN,
and how each weight format runs here (``minispec.models.kernels.format_support``): native, emulated
(it runs, slower than its bytes promise: bfloat16 without AVX512-BF16 or AMX) or unavailable.
Once ``python -m minispec profile`` has measured this machine (data/hardware/this.json), the card
adds its fitted fixed time per step.

``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` restrict PyTorch and oneDNN to AVX2 on any x86
host; the bfloat16 probe then says what it says on a laptop without bfloat16 instructions.
Taught in notebooks/00_quickstart.ipynb and notebooks/01_decode_is_memory_bound.ipynb.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from minispec.models.kernels import WEIGHT_FORMATS, format_support, onednn_available

# ``python -m minispec profile`` writes this machine's fit here (minispec/cost/hardware.py's folder)
PROFILE = Path(__file__).resolve().parents[2] / "data" / "hardware" / "this.json"

# the instruction-set switches a learner may set; a value PyTorch or oneDNN would ignore is refused
ISA_VARIABLES = {
    "ATEN_CPU_CAPABILITY": ("default", "avx2", "avx512", "zvector", "vsx", "sve256"),
    "ONEDNN_MAX_CPU_ISA": ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                           "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16",
                           "AVX10_1_512_AMX", "AVX512_CORE_AMX", "AVX10_1_512_AMX_FP16",
                           "AVX512_CORE_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "DEFAULT"),
}


def check_isa_variables(environ=os.environ) -> None:
    """Raise ValueError naming an instruction-set variable set to a value its library does not know
    (PyTorch and oneDNN ignore such a value without a word, so a run would not be what was asked)."""
    for name, allowed in ISA_VARIABLES.items():
        value = environ.get(name)
        if value is not None and value.upper() not in {a.upper() for a in allowed}:
            raise ValueError(f"{name}={value!r}: choose one of {', '.join(allowed)} (or unset it)")


def machine_name(device_type: str = "cpu") -> str:
    """The name a profile records for this machine's ``device_type`` ("cpu": the CPU's model name
    from /proc/cpuinfo where there is one, and its core count; "cuda": the GPU's name), as
    ``minispec.sim.profile.hardware_from_fit`` stores it in ``fit["device"]``."""
    if device_type == "cuda":
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return f"{names[0] if names else platform.machine()}, {os.cpu_count()} cores"


def machine_card(device: torch.device | str = "cpu") -> dict:
    """This machine as the engine sees it: {"machine", "cores", "threads", "capability", "onednn",
    "formats" (format -> "native" / "emulated: why" / "unavailable: why"), "step_cost" (the
    profiled fit's {"step_overhead_ms", "machine" it ran on, "same_name" as this one}, or None
    before ``python -m minispec profile``)}."""
    device = torch.device(device)
    step_cost = None
    if PROFILE.exists():
        this = json.loads(PROFILE.read_text())
        profiled_on = (this.get("fit") or {}).get("device", this["description"])
        step_cost = {"step_overhead_ms": this["step_overhead_s"] * 1e3, "machine": profiled_on,
                     "same_name": profiled_on == machine_name(device.type)}
    return {"machine": machine_name(device.type), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "capability": torch.backends.cpu.get_cpu_capability(), "onednn": onednn_available(),
            "formats": format_support(device), "step_cost": step_cost}


def format_machine_card(card: dict) -> str:
    """The card as a few lines of text (the default weights named as the engine's choice)."""
    onednn = "present" if card["onednn"] else "absent: the fast kernels fall back to the reference x @ W"
    lines = [f"machine: {card['machine']}; torch uses {card['threads']} of {card['cores']} threads; "
             f"CPU capability {card['capability']}; oneDNN {onednn}"]
    native = [f for f in WEIGHT_FORMATS if card["formats"][f] == "native"]
    lines.append(f"weights native here: {', '.join(native)} (the default is float32)")
    lines += [f"  {f}: {why}" for f, why in card["formats"].items() if why != "native"]
    cost = card["step_cost"]
    if cost:
        whose = ("a CPU of this one's name (the name does not tell instruction sets apart)"
                 if cost["same_name"] else "another machine")
        lines.append(f"step cost: fixed {cost['step_overhead_ms']:.2f} ms per step in "
                     f"data/hardware/this.json, profiled on {cost['machine']}: {whose}; "
                     "python -m minispec profile measures this one")
    else:
        lines.append("step cost: not profiled yet (python -m minispec profile measures it)")
    return "\n".join(lines)
