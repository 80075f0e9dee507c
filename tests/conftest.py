"""Shared fixtures: tiny random-weight Llama models (fast) and the real bundled model (slow, cached).

A tiny model uses the bundled tokenizer's vocabulary size, so text prompts, chat templates and stop
strings work with it, while a forward costs microseconds.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import pytest
import torch

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.build import build_engine
from minispec.core.engine import Engine
from minispec.models.llama import LlamaModel, ModelConfig

FAST = os.environ.get("MINISPEC_FAST") == "1"


@pytest.fixture(autouse=True)
def engine_log_left_as_found():
    """A command run in-process (cli ``main``) points the "minispec" logger at that test's captured
    stderr and lowers it to INFO (``cli.args.show_engine_log``); undo both after every test, or a
    later test on the same worker logs INFO lines into its caplog and writes to a closed stream."""
    logger = logging.getLogger("minispec")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
# the kernels tiny engines run: "reference" (plain x @ W, where greedy speculation must equal plain
# decoding token for token) unless MINISPEC_KERNELS=fast reruns the equivalence suite on oneDNN
KERNELS = os.environ.get("MINISPEC_KERNELS", "reference")


def load_bench_script(name: str):
    """bench/<question>/<name>.py imported as a module (the scripts are files, not a package)."""
    path, = (Path(__file__).resolve().parents[1] / "bench").glob(f"*/{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_config(vocab_size: int = 256, **overrides) -> ModelConfig:
    return ModelConfig.tiny(vocab_size, **overrides)


def tiny_engine(model: LlamaModel | None = None, seed: int = 0, spec: SpecConfig | None = None, draft=None,
                policy=None, **sched) -> Engine:
    """An engine on a tiny random model (no tokenizer: prompts are token id lists); ``policy``: a
    SpecPolicy object instead of the one ``spec.policy`` spells; ``memory_follows_use=False``: a
    pool that keeps freed cached blocks until it has no other block (an accelerator's, whose memory
    is committed up front), where the CPU default evicts one before touching a block never used."""
    model = model or LlamaModel.random(tiny_config(), seed=seed)
    kv = sched.pop("num_kv_blocks", 64)
    block_size = sched.pop("block_size", 4)
    max_len = sched.pop("max_model_len", 128)
    kernels, weights = sched.pop("kernels", KERNELS), sched.pop("weights", None)
    prefix_caching = sched.pop("enable_prefix_caching", True)
    follows = sched.pop("memory_follows_use", None)
    compile_step = sched.pop("compile", None)
    config = EngineConfig(model="tiny", device="cpu", seed=seed, block_size=block_size, num_kv_blocks=kv,
                          max_model_len=max_len, kernels=kernels, weights=weights,
                          enable_prefix_caching=prefix_caching, compile=compile_step,
                          scheduler=SchedulerConfig(**sched),
                          spec=spec or SpecConfig())
    engine = build_engine(config, model=model, draft=draft, policy=policy)
    if follows is not None:
        engine.block_manager.memory_follows_use = follows
    return engine


def use_drafter(engine, drafter) -> None:
    """Put ``drafter`` (any Drafter) in ``engine`` in place of the built one, inside a DrafterGuard
    as the builders put theirs."""
    from minispec.speculation.drafter_guard import DrafterGuard

    engine.drafter = DrafterGuard(drafter, engine.executor.vocab_size)


def drafter_of(engine):
    """The drafter an engine built (the one inside its DrafterGuard), or None without speculation."""
    return getattr(engine.drafter, "inner", None)


def record_draft_forwards(drafter) -> list[tuple[bool, list]]:
    """Spy on a draft model's forwards: the list returned gets (whether it is its proposal's first
    forward, the catch-up; its ForwardItems) for every forward the drafter runs from then on."""
    seen, propose, forward = [], drafter.propose, drafter.runner.forward
    first = [False]

    def marking_propose(scheduled):
        first[0] = True
        return propose(scheduled)

    def recording_forward(items, **kw):
        seen.append((first[0], list(items)))
        first[0] = False
        return forward(items, **kw)

    drafter.propose, drafter.runner.forward = marking_propose, recording_forward
    return seen


@pytest.fixture
def tiny_model() -> LlamaModel:
    return LlamaModel.random(tiny_config(), seed=0)


@pytest.fixture(scope="session")
def bundled():
    """(model, tokenizer, hf_config) for the bundled SmolLM2-135M-Instruct, loaded once per worker
    through the engine's own loader: from the converted cache in about a second (its GGUF is
    dequantized once per machine, not once per test worker)."""
    from minispec.models.loader import BUNDLED_TARGET, load_model

    model, tokenizer, hf_config = load_model(BUNDLED_TARGET, torch.device("cpu"), torch.float32)
    return model.eval().requires_grad_(False), tokenizer, hf_config


@pytest.fixture(scope="session")
def bundled_hf():
    """transformers' own model of the bundled checkpoint (the reference the logits are held to),
    read from the GGUF file (about 20 s): only the tests that compare against transformers ask for it."""
    from minispec.models.loader import BUNDLED_TARGET, load_hf_model, resolve_model

    return load_hf_model(resolve_model(BUNDLED_TARGET)).eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, bundled) -> str:
    """A directory with a tiny random Llama checkpoint and the bundled tokenizer, loadable by path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = bundled[1]
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                      bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)
