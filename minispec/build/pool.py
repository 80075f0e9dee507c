"""The KV pool's size, the scheduler over it and the runner over its K/V, as the builders make them.

One formula sizes the pool for the real engine (its configured budget) and for the simulator (the
device memory left after the weights), and one function builds the block manager (plain, or
prefix-caching) and the scheduler over it: ``minispec/build/engine.py`` and ``minispec/sim/executor.py``
call it, so the two clocks schedule the same batches. It sits beside the builders, above the core
and the prefix cache it assembles; the K/V tensors themselves are minispec/base/kv_cache.py's.
``build_runner`` gives a model its KVCache and its runner (a GraphModelRunner when CUDA graphs
are on): the target's in minispec/build/engine.py, a draft model's in minispec/build/speculation.py.
Taught in notebooks/00_quickstart.ipynb and notebooks/02_continuous_batching.ipynb.
"""

from __future__ import annotations

import torch

from minispec.core.block_manager import BlockManager
from minispec.base.config import EngineConfig
from minispec.base.kv_cache import KVCache
from minispec.core.model_runner import ModelRunner
from minispec.graphs.compiled_step import CompiledStepRunner, compile_unavailable
from minispec.graphs.cuda_graphs import PAD_BLOCKS, GraphModelRunner
from minispec.kv.prefix_cache import PrefixCachingBlockManager
from minispec.models.kernels import effective_kernels
from minispec.core.scheduler import Scheduler


def memory_follows_use(device_type: str) -> bool:
    """Whether a KV pool on a device of ``device_type`` (torch's ``device.type``: "cpu", "cuda",
    ...) commits memory as its blocks are first used, so its BlockManager should evict a cached
    block before touching a never-used one (``PrefixCachingBlockManager(memory_follows_use=...)``): True on a
    CPU, whose operating system backs only the pages written (``KVCache.ready``); False on an
    accelerator, whose pool is allocated whole up front, so a never-used block costs nothing more
    and keeping cached blocks longer only gains hits. The real engine and the simulator (for the
    device it models) both ask this, so they evict alike and schedule the same batches."""
    return device_type == "cpu"


def kv_pool_blocks(num_kv_blocks: int | None, kv_cache_bytes: float, kv_bytes_per_token: float,
                   block_size: int, max_model_len: int) -> int:
    """Blocks in the KV pool: ``num_kv_blocks`` when given, else as many as ``kv_cache_bytes`` holds.

    One formula for the real engine (its configured budget) and the simulator (device memory left
    after the weights). ``kv_bytes_per_token`` is what one token costs in every pool that grows
    with the target's (the target's K/V, plus a draft model's when it keeps its own cache), so the
    budget covers them all.

    Raises: ValueError when the pool cannot hold one request of ``max_model_len`` tokens.
    """
    if num_kv_blocks is not None:
        num = num_kv_blocks
    else:
        num = int(kv_cache_bytes // (kv_bytes_per_token * block_size))
    need = -(-max_model_len // block_size)
    if num < need:
        raise ValueError(
            f"KV pool of {num} blocks x {block_size} tokens cannot hold one request of "
            f"max_model_len={max_model_len} tokens (needs {need} blocks): raise num_kv_blocks or "
            f"kv_cache_bytes, or lower max_model_len")
    return num


def build_scheduler(config: EngineConfig, max_model_len: int, kv_bytes_per_token: float, policy=None,
                    max_draft_len: int | None = None, kv_cache_bytes: float | None = None,
                    memory_follows_use: bool = False) -> Scheduler:
    """The KV block pool and the scheduler over it, as both engine builders make them.

    Args:
        config: block size, pool size (``num_kv_blocks`` or ``kv_cache_bytes``), prefix caching
            (a PrefixCachingBlockManager when on), scheduler settings.
        max_model_len: longest sequence in tokens.
        kv_bytes_per_token: bytes one token costs in every pool that grows with the target's (the
            target's K/V plus a draft model's, plus the features an EAGLE head reads), so the
            budget covers them all.
        policy, max_draft_len: passed to the Scheduler.
        kv_cache_bytes: the budget when ``config.num_kv_blocks`` is None (default
            ``config.kv_cache_bytes``; the simulator passes the device memory left after weights).
        memory_follows_use: see ``PrefixCachingBlockManager``; ``memory_follows_use(device_type)``
            for the device the engine runs on (the real one) or models (the simulator).
    Raises: ValueError when the pool cannot hold one request of ``max_model_len``.
    """
    budget = config.kv_cache_bytes if kv_cache_bytes is None else kv_cache_bytes
    num_blocks = kv_pool_blocks(config.num_kv_blocks, budget, kv_bytes_per_token, config.block_size,
                                max_model_len)
    if config.enable_prefix_caching:
        block_manager = PrefixCachingBlockManager(num_blocks, config.block_size, memory_follows_use)
    else:
        block_manager = BlockManager(num_blocks, config.block_size)
    return Scheduler(config.scheduler, block_manager, max_model_len, policy=policy,
                     max_draft_len=max_draft_len)


def use_cuda_graphs(setting: bool | None, device: torch.device) -> bool:
    """Whether an engine on ``device`` records CUDA graphs: ``setting`` (EngineConfig.cuda_graphs),
    where None means on for CUDA and off elsewhere.

    Raises: ValueError for True on a device that is not CUDA.
    """
    if setting is None:
        return device.type == "cuda"
    if setting and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs a CUDA device; this engine runs on {device.type}: "
                         "leave cuda_graphs unset (None) or False")
    return bool(setting)


def use_compile(setting: bool | None, device: torch.device) -> bool:
    """Whether an engine on ``device`` compiles its CPU step (EngineConfig.compile): None means off.

    Raises: ValueError for True off a CPU or without a C++ compiler, naming what is missing.
    """
    if not setting:
        return False
    if device.type != "cpu":
        raise ValueError(f"compile=True compiles a CPU step; this engine runs on {device.type}, where "
                         "cuda_graphs captures the step instead")
    missing = compile_unavailable()
    if missing:
        raise ValueError(f"compile=True: {missing}; leave compile unset (None) or False")
    return True


def build_runner(model, block_manager, device: torch.device, dtype: torch.dtype, graphs: bool,
                 compiled: bool = False, **runner_kwargs) -> ModelRunner:
    """A runner and its KVCache for ``model`` over ``block_manager``'s pool: a GraphModelRunner
    (its cache one pad block larger) when ``graphs``, a CompiledStepRunner (likewise) when
    ``compiled``, else a plain ModelRunner.

    Args:
        runner_kwargs: ModelRunner's kernels, weights and capture_layers.
    """
    cfg = model.cfg
    if "kernels" in runner_kwargs:  # "fast" without oneDNN runs the reference, with one warning
        runner_kwargs["kernels"] = effective_kernels(runner_kwargs["kernels"], device)
    kv = KVCache(cfg.num_layers, block_manager.num_blocks + (PAD_BLOCKS if graphs or compiled else 0),
                 block_manager.block_size, cfg.num_kv_heads, cfg.head_dim, dtype, device)
    if graphs:  # off a GPU (tests) the padded buffers run eagerly
        return GraphModelRunner(model, kv, block_manager, device, capture=device.type == "cuda",
                                **runner_kwargs)
    if compiled:
        return CompiledStepRunner(model, kv, block_manager, device, **runner_kwargs)
    return ModelRunner(model, kv, block_manager, device, **runner_kwargs)
