"""Notebook 10's exercise (notebooks/10_packed_device_lab.ipynb): the prefill tokens a warm prefix
cache saves.
"""

from __future__ import annotations

from course.checks import check_function


def prefill_tokens_saved(prompt_tokens: list[int], shared_prefix_tokens: int, block_size: int) -> int:
    """Prompt tokens a warm prefix cache spares prefill, summed over requests.

    Every request starts with the same ``shared_prefix_tokens`` tokens, already cached (a server
    that has served this traffic). Only full blocks are cached, and the last prompt token is always
    computed (its logits give the first output token), so request i skips
    ``block_size * min(shared_prefix_tokens // block_size, (prompt_tokens[i] - 1) // block_size)``.
    """
    full_blocks = shared_prefix_tokens // block_size
    return sum(block_size * min(full_blocks, (p - 1) // block_size) for p in prompt_tokens)


def check_10_prefix_saving(fn, quiet=False) -> str:
    cases = [(([600, 620, 640], 560, 16), 3 * 560),       # a prefix of whole blocks, longer prompts
             (([600, 600], 570, 16), 2 * 560),            # a part block is computed again
             # a prompt that is all prefix: its last block is computed
             (([64, 64], 64, 16), 2 * 48),
             (([100], 10, 16), 0),                         # a prefix shorter than a block saves nothing
             (([33, 300, 17], 200, 16), 32 + 192 + 16),   # short prompts cap what they can hit
             (([550] * 8, 550, 32), 8 * 544)]
    return check_function("10 prefill tokens a warm prefix cache saves", fn, cases, quiet=quiet)
