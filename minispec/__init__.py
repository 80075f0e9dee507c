"""minispec: a small, readable inference engine for learning speculative decoding vs batching.

Public API: LLM (high level), Engine / build_engine (step by step), SamplingParams, and the
config dataclasses. See docs/architecture.md for the request lifecycle and module map.
"""

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.build import build_engine
from minispec.core.engine import Engine
from minispec.llm import LLM
from minispec.core.request import RequestOutput, SamplingParams

__all__ = ["LLM", "Engine", "build_engine", "EngineConfig", "SchedulerConfig", "SpecConfig",
           "SamplingParams", "RequestOutput"]
