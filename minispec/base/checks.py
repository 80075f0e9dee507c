"""The checks a request passes before it is queued (``SamplingParams`` and ``Engine.check_request``
call them): each raises ValueError naming the bad value and what is allowed, so a refused request
changes nothing. Booleans are not numbers here (``True`` is not 1)."""

from __future__ import annotations

import math

SEED_RANGE = (-2**63, 2**63 - 1)  # int64, the range vLLM's OpenAI server accepts


def is_int(value) -> bool:  # an integer, not a boolean
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:  # an int or a float, not a boolean
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_sampling_params(p) -> None:
    """Check every field of a ``SamplingParams`` (``stop``, ``stop_token_ids`` made tuples): ValueError."""
    if not is_int(p.max_tokens) or p.max_tokens < 1:
        raise ValueError(f"max_tokens={p.max_tokens!r}: must be an integer >= 1")
    if not is_number(p.temperature) or not math.isfinite(p.temperature) or p.temperature < 0:
        raise ValueError(f"temperature={p.temperature!r}: must be a finite number >= 0 (0 = greedy)")
    if not is_int(p.top_k) or p.top_k < 0:
        raise ValueError(f"top_k={p.top_k!r}: must be an integer >= 0 (0 = no top-k)")
    if not is_number(p.top_p) or not (0.0 < p.top_p <= 1.0):
        raise ValueError(f"top_p={p.top_p!r}: must be in (0, 1]")
    if p.seed is not None and not (is_int(p.seed) and SEED_RANGE[0] <= p.seed <= SEED_RANGE[1]):
        raise ValueError(f"seed={p.seed!r}: must be None or an integer in {SEED_RANGE[0]} .. {SEED_RANGE[1]}")
    if any(not isinstance(s, str) or s == "" for s in p.stop):
        raise ValueError(f"stop={p.stop!r}: stop strings must be non-empty strings")
    if not isinstance(p.stop_token_ids, tuple) or any(not is_int(t) or t < 0 for t in p.stop_token_ids):
        raise ValueError(f"stop_token_ids={p.stop_token_ids!r}: must be a list of token ids (integers >= 0)")
    if not is_int(p.min_tokens) or not 0 <= p.min_tokens <= p.max_tokens:
        raise ValueError(f"min_tokens={p.min_tokens!r}: must be an integer in 0..max_tokens ({p.max_tokens})")
    k = p.num_speculative_tokens
    if k is not None and (not is_int(k) or not 0 <= k <= 16):
        raise ValueError(f"num_speculative_tokens={k!r}: must be None, 0 (opt out) or 1..16")


def check_prompt_ids(ids: list[int], max_model_len: int, vocab_size: int | None,
                     stop_token_ids: tuple[int, ...] = ()) -> None:
    """Check a tokenized prompt: 1 to ``max_model_len - 1`` tokens (one output token must fit), every id
    and every stop token id in ``0..vocab_size - 1`` (None: not checked). Raises: ValueError."""
    if not ids:
        raise ValueError("prompt is empty: give at least one token")
    if len(ids) >= max_model_len:
        raise ValueError(f"prompt has {len(ids)} tokens but max_model_len is {max_model_len}: "
                         f"it must be at most {max_model_len - 1} tokens so one output token fits")
    if vocab_size is not None and (min(ids) < 0 or max(ids) >= vocab_size):
        raise ValueError(f"prompt token ids must be in 0..{vocab_size - 1}")
    if vocab_size is not None and any(t >= vocab_size for t in stop_token_ids):
        raise ValueError(f"stop_token_ids={list(stop_token_ids)}: stop_token_ids must be in "
                         f"0..{vocab_size - 1}")
