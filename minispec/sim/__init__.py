"""The simulator: minispec's own engine, scheduler, policies and metrics on a virtual clock.

A roofline cost model (costmodel.py) prices each step from the hardware (hardware.py) and the model's shape
(modelspec.py); the SimExecutor (executor.py) stands in for the real executor, so a laptop can show what an
H100 does at concurrency 64. Taught in notebooks/01_decode_is_memory_bound.ipynb and
notebooks/05_messenger_vs_truck.ipynb.
"""

from minispec.speculation.acceptance import FixedAlpha, RouteAlpha, TraceAcceptance
from minispec.cost.model import CostModel, StepCost, expected_accepted_length, leviathan_speedup
from minispec.sim.executor import SimExecutor, VirtualClock, build_sim_engine
from minispec.cost.hardware import HardwareSpec, available_hardware, load_hardware
from minispec.cost.modelspec import ModelSpec, available_models, load_model_spec
from minispec.sim.sweep import sim_rows, sweep

__all__ = ["CostModel", "StepCost", "expected_accepted_length", "leviathan_speedup", "SimExecutor",
           "VirtualClock", "build_sim_engine", "HardwareSpec", "available_hardware", "load_hardware",
           "ModelSpec", "available_models", "load_model_spec", "FixedAlpha", "RouteAlpha", "TraceAcceptance",
           "sim_rows", "sweep"]
