"""Tensor parallelism in the cost model: one forward split over the GPUs of a node.

Megatron-style tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", sec. 3) splits every layer's
attention heads and MLP columns over P GPUs, so each GPU reads 1/P of the weights and of the KV
cache and does 1/P of the FLOPs, and pays two all-reduces of the N x E activations per layer (after
attention and after the MLP). A ring all-reduce moves 2 (P - 1) / P of the message per GPU
(Patarasuk and Yuan 2009); small messages cost a fixed latency instead, which is what a decode step
of a few tokens pays 2 L times. Published speculation tables for 70B models (vLLM's 2024 blog,
SpecDecode-Bench) ran on 4 GPUs this way.
Invariant: P = 1 costs exactly what the single-device model costs (no all-reduce, nothing divided).
Taught in notebooks/05_messenger_vs_truck.ipynb (the published tables beside the simulator).
"""

from __future__ import annotations

from minispec.cost.hardware import HardwareSpec

ACTIVATION_BYTES = 2.0  # all-reduces carry bf16 activations whatever the weights' dtype


def check_tensor_parallel(size: int, hardware: HardwareSpec,
                          num_heads: int, num_kv_heads: int, name: str) -> None:
    """Refuse a split the cost model cannot price.

    Raises:
        ValueError: for a size below 1, heads not divisible by the size (KV heads are replicated
            when fewer than the size, as vLLM does), or size > 1 on hardware without an
            all-reduce latency in its spec.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size={size!r}: must be an integer >= 1")
    if size == 1:
        return
    if num_heads % size:
        raise ValueError(f"{name}: {num_heads} attention heads do not split over tensor_parallel_size={size}")
    if num_kv_heads >= size and num_kv_heads % size:
        raise ValueError(f"{name}: {num_kv_heads} KV heads do not split over tensor_parallel_size={size}")
    if hardware.allreduce_latency_s is None or not hardware.interconnect_bandwidth_bytes_per_s:
        raise ValueError(f"hardware {hardware.name!r} has no all-reduce latency or interconnect bandwidth in "
                         "its spec: tensor parallelism cannot be priced there")


def kv_split(size: int, num_kv_heads: int) -> float:
    """The share of a model's KV cache one GPU holds and reads: 1/P, or 1/Hkv when KV heads are
    fewer than the GPUs and get replicated."""
    return 1.0 / min(size, num_kv_heads)


def allreduce_time_s(hardware: HardwareSpec, size: int, num_bytes: float) -> float:
    """Seconds of one all-reduce of ``num_bytes`` over ``size`` GPUs: the latency plus a ring's
    2 (P - 1) / P x bytes over the interconnect bandwidth; 0 for one GPU."""
    if size <= 1:
        return 0.0
    return (hardware.allreduce_latency_s + 2.0 * (size - 1) / size * num_bytes
            / hardware.interconnect_bandwidth_bytes_per_s)
