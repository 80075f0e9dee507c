"""Text in and out: prompts (raw text, chat messages or token ids) to token ids, output ids to text.

The engine works in token ids only; a transformers tokenizer turns prompts into ids here (chat
messages through the tokenizer's chat template) and a finished request's ids back into text, cut
before the stop string or the stop token id that ended it (the id stays in ``output_token_ids``,
as in vLLM). Invariant: special tokens never reach the text. Used by ``Engine.tokenize`` and
``Engine.text``; taught in notebooks/00_quickstart.ipynb.
"""

from __future__ import annotations

import itertools

from minispec.core.request import Request


def tokenize(tokenizer, prompt) -> list[int]:
    """Raw text, chat messages (list of {"role", "content"}) or token ids -> token ids.

    Raises: ValueError for another type, or for text and chat messages without a tokenizer.
    """
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        _need_tokenizer(tokenizer, "chat messages")
        return chat_template_ids(tokenizer, prompt)
    if isinstance(prompt, str):
        _need_tokenizer(tokenizer, "a text prompt")
        return tokenizer(prompt)["input_ids"] if prompt else []
    if isinstance(prompt, (list, tuple)) and all(map(isinstance, prompt, itertools.repeat(int))):
        return list(prompt)  # (the check runs in C: the simulator adds thousands of long prompts)
    raise ValueError(f"prompt of type {type(prompt).__name__}: give a string, a list of chat "
                     "messages ({'role': ..., 'content': ...}) or a list of token ids")


def _need_tokenizer(tokenizer, what: str) -> None:
    if tokenizer is None:
        raise ValueError(f"{what} needs a tokenizer; this engine has none, so pass token ids")


def chat_template_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of chat ``messages`` in the tokenizer's chat template (ending with the assistant
    header when ``add_generation_prompt``). transformers returns a list or a BatchEncoding."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def decode(tokenizer, token_ids: list[int]) -> str:
    """Output text of ``token_ids``, special tokens skipped (what stop strings are matched in)."""
    return tokenizer.decode(token_ids, skip_special_tokens=True)


def output_text(tokenizer, req: Request) -> str:
    """A request's output text: special tokens skipped, cut before the stop string or the stop
    token id that ended it ("" without a tokenizer)."""
    if tokenizer is None:
        return ""
    ids = req.output_token_ids[:-1] if isinstance(req.stop_reason, int) else req.output_token_ids
    text = decode(tokenizer, ids)
    return text if req.stop_text_len is None else text[: req.stop_text_len]
