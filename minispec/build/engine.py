"""Build a real engine from an EngineConfig: the model, the KV pool, the drafter and the policy.

1. Load the target (or take a loaded one) on the chosen device and dtype.
2. Load the draft model when ``spec.method == "draft"``: the KV budget covers both pools.
3. Size the KV pool and build the scheduler (``minispec.build.pool.build_scheduler``, which the
   simulator's builder shares); the pool budgets the target features a drafter declares it reads
   (``build.speculation.feature_channel``).
4. Make the policy ("auto" and "goodput" price steps with a cost model of the live models on the
   profiled hardware), the runner (which owns the kernel choice; on CUDA it replays graphs,
   minispec/graphs/cuda_graphs.py), the drafter (in its DrafterGuard) and the executor (a
   GrammarModelExecutor: trees verified too, structured outputs masked,
   minispec/structured/grammar_executor.py); the engine is a GuardedEngine
   (minispec/guard/engine_guard.py) whose stop checks end a grammar's output;
   when it speculates, an AcceptanceWatch observes it (minispec/speculation/acceptance_watch.py).
The adaptive policies price steps with the cost model (minispec/cost/); the simulator's own
builder, ``minispec.sim.build_sim_engine``, uses this folder's pool and policy builders.
Taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import functools
import logging

import torch

from minispec.speculation.acceptance_watch import AcceptanceWatch
from minispec.base.config import EngineConfig
from minispec.core.engine import Engine
from minispec.guard.engine_guard import GuardedEngine
from minispec.structured.grammar import GrammarStopChecker, StructuredOutputManager
from minispec.structured.grammar_executor import GrammarModelExecutor
from minispec.build.pool import (build_runner, build_scheduler, memory_follows_use, use_compile,
                                  use_cuda_graphs)
from minispec.models.kernels import format_support, weight_bytes_per_token
from minispec.models.loader import load_model, pick_device, pick_dtype
from minispec.cost.model import CostModel
from minispec.build.speculation import (engine_policy, feature_channel, load_draft_model, make_drafter,
                                   needs_cost_model)
from minispec.speculation.policy import SpecPolicy
from minispec.core.support.stops import eos_ids
from minispec.core.support.text import decode

_WARNED_EMULATED: set[str] = set()  # the weight formats whose emulation was already reported


def build_engine(config: EngineConfig | None = None, model=None, tokenizer=None, hf_config=None,
                 draft=None, policy: SpecPolicy | None = None,
                 capture_layers: tuple[int, ...] = ()) -> Engine:
    """Build a real engine: load (or take) the target, size the KV pool, set up speculation.

    Args:
        config: EngineConfig (defaults to the bundled model).
        model, tokenizer, hf_config: an already-loaded target (tests pass tiny random models).
        draft: an already-loaded draft for ``spec.method == "draft"``: a LlamaModel, or
            (model, tokenizer, vocab_map) as ``minispec.models.draft.load_draft`` returns.
        policy: a SpecPolicy object to use instead of the one ``config.spec.policy`` spells
            (speculation must be on: ``config.spec.method`` other than "off").
        capture_layers: target layers the runner also returns (EAGLE-3 training data); default: the drafter's.
    Raises: ValueError for a bad model name, device, pool size or speculation setting.
    """
    config = config or EngineConfig()
    device = pick_device(config.device)
    dtype = pick_dtype(config.dtype, device)
    if model is None:
        model, tokenizer, hf_config = load_model(config.model, device, dtype)
    else:
        model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    cfg = model.cfg
    max_len = config.max_model_len or cfg.max_position_embeddings
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"max_model_len={max_len} exceeds the model's limit {cfg.max_position_embeddings}")
    spec = config.spec
    draft_model = vocab_map = None
    if spec.method == "draft":
        draft_model, vocab_map = load_draft_model(config, model, tokenizer, device, dtype, draft)
    # per token: the target's K/V, a draft model's, and the target features a drafter reads
    channel = feature_channel(config, draft_model)
    kv_elements = cfg.kv_elements_per_token + (draft_model.cfg.kv_elements_per_token if draft_model else 0) \
        + (channel.width if channel else 0)
    itemsize = torch.empty((), dtype=dtype).element_size()
    cost_model = None
    if policy is None and spec.enabled and needs_cost_model(spec.policy):
        cost_model = CostModel.for_live_models(cfg, str(dtype).removeprefix("torch."),
                                               draft_model.cfg if draft_model is not None else None)
    policy = engine_policy(spec, policy, cost_model)
    scheduler = build_scheduler(config, max_len, kv_elements * itemsize, policy,
                                max_draft_len=draft_model.cfg.max_position_embeddings if draft_model
                                else None,
                                memory_follows_use=memory_follows_use(device.type))
    bm = scheduler.block_manager
    logging.getLogger("minispec").info("%s", kv_report(
        bm.num_blocks, config.block_size, cfg.kv_elements_per_token * itemsize,
        draft_model.cfg.kv_elements_per_token * itemsize if draft_model else 0,
        config.kv_cache_bytes if config.num_kv_blocks is None else None, config.enable_prefix_caching))
    graphs, compiled = use_cuda_graphs(config.cuda_graphs, device), use_compile(config.compile, device)
    # decided here only: a target is captured unless a head reads its inner layers (EAGLE-3)
    capture_layers = tuple(capture_layers) or (channel.layers if channel else ())
    captured = not capture_layers
    runner = build_runner(model, bm, device, dtype, graphs and captured, compiled and captured,
                          kernels=config.kernels, weights=config.weights, capture_layers=capture_layers)
    logging.getLogger("minispec").info("%s", weights_report(runner))
    support = format_support(device).get(runner.weights, "native")
    if support != "native" and runner.weights not in _WARNED_EMULATED:  # by --weights or --dtype
        _WARNED_EMULATED.add(runner.weights)  # asked for by name: it runs, and says so once per process
        logging.getLogger("minispec").warning(
            "weights %s run emulated on this machine (%s): slower than their bytes promise; "
            "float32 is native",
            runner.weights, support.removeprefix("emulated: "))
    grammars = StructuredOutputManager(tokenizer, cfg.vocab_size)
    drafter = make_drafter(config, cfg.vocab_size, bm, device, dtype, draft_model, vocab_map, graphs=graphs,
                           grammars=grammars, compiled=compiled)
    executor = GrammarModelExecutor(runner, drafter, grammars, jump_forward=spec.jump_forward,
                                    drafter_masks=spec.method == "draft" and spec.mask_draft)
    eos = eos_ids(tokenizer, hf_config)
    detokenize = functools.partial(decode, tokenizer) if tokenizer is not None else None
    stops = GrammarStopChecker(max_len, eos, detokenize, grammars)
    engine = GuardedEngine(config, scheduler, executor, tokenizer, max_model_len=max_len, eos_token_ids=eos,
                           stops=stops)
    if drafter is not None:  # speculation that stops paying is logged, once per engine
        engine.add_observer(AcceptanceWatch(source=f"drafter {type(drafter.inner).__name__}"))
    return engine


def weights_report(runner) -> str:
    """The start-up line on the target's weights: their format and the bytes a batch-1 decode
    step reads (minispec/models/kernels.py, ``weight_bytes_per_token``)."""
    what = {"int4": "4-bit codes, a bfloat16 scale and zero per 32 weights; LM head int8",
            "int8": "int8, a scale per output channel"}.get(runner.weights, runner.weights)
    num_bytes = weight_bytes_per_token(runner.prepared, runner.model)
    return (f"weights: {runner.weights} ({what}), {runner.kernels} kernels; a decode step reads "
            f"{num_bytes / 1e6:.1f} MB of weights")


def kv_report(num_blocks: int, block_size: int, target_bytes_per_token: int, draft_bytes_per_token: int,
              kv_cache_bytes: int | None, prefix_caching: bool = False) -> str:
    """The start-up line on the KV pools: blocks, bytes per token and MiB of each pool, what sized
    them, and whether the target's pool caches prefixes. A draft model's pool has as many blocks
    as the target's, so ``kv_cache_bytes`` (None: ``num_kv_blocks`` was given) covers both, split
    by their bytes per token."""
    def pool(name: str, bytes_per_token: int) -> str:
        return (f"{name} {bytes_per_token} bytes per token "
                f"({bytes_per_token * num_blocks * block_size / 2**20:.1f} MiB)")

    pools = pool("target", target_bytes_per_token)
    if draft_bytes_per_token:
        pools += " + " + pool("draft", draft_bytes_per_token)
    if kv_cache_bytes is None:
        source = "num_kv_blocks" + (" (each pool has that many blocks)" if draft_bytes_per_token else "")
    else:
        source = (f"kv_cache_bytes={kv_cache_bytes} ({kv_cache_bytes / 2**20:.1f} MiB)"
                  + (", one budget for both pools" if draft_bytes_per_token else ""))
    return (f"KV cache: {num_blocks} blocks of {block_size} tokens; {pools}; sized by {source}; "
            f"prefix caching {'on' if prefix_caching else 'off'}")
