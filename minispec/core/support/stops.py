"""Stop handling: where a request's output ends, and what it keeps of a step's tokens.

After the executor answers a step, the engine asks ``StopChecker.keep`` for each request: its
tokens are cut at the first that ends it (EOS or a chat end token unless ``ignore_eos``, one of
``stop_token_ids``, a completed stop string, each only from ``min_tokens`` on; ``max_tokens``;
``max_model_len``), and the scheduler applies only what is kept. A stop inside a block of accepted
drafts drops the tokens after it, and the stop token stands where the target's own token stood:
the drafts before it count as proposed and accepted and none at or after it does, so every kept
verify holds its accepted drafts plus exactly one token, and the mean accepted length is the same
number whether computed as tokens per verify step or as 1 + accepted / verify steps (what a
server's counters give).
Invariant: no token past a stop is kept or counted (streams, counters, metrics, server).
Read after the core (docs/architecture.md, lifecycle step 6); every notebook's requests end here.
"""

from __future__ import annotations

from typing import Callable

from minispec.core.batch import EmittedTokens, KeptTokens, ScheduledRequest
from minispec.core.request import Request, RequestStatus


class StopChecker:
    """Decides where each request's output ends.

    Args:
        max_model_len: longest sequence in tokens (a request reaching it ends with "length").
        eos_token_ids: tokens that end a request (EOS, chat end token; ``eos_ids``).
        detokenize: ``f(token_ids) -> str``, the output text stop strings are looked for in (None:
            stop strings are never matched, as without a tokenizer).
    """

    def __init__(self, max_model_len: int, eos_token_ids: frozenset[int] = frozenset(),
                 detokenize: Callable[[list[int]], str] | None = None):
        self.max_model_len = max_model_len
        self.eos_token_ids = eos_token_ids
        self.detokenize = detokenize

    def keep(self, sched: ScheduledRequest, out: EmittedTokens) -> KeptTokens:
        """What the request of ``sched`` keeps of ``out``: its tokens up to and including the first
        that ends it, and the draft counts before it (see the module doc). Changes nothing
        (``Scheduler.update`` applies it).

        A token ends a request when, counting it, the output has at least ``min_tokens`` tokens and
        it is EOS (unless ``ignore_eos``), one of ``stop_token_ids``, or completes a stop string; or
        when the output reaches ``max_tokens`` or the sequence ``max_model_len``.
        """
        req = sched.request
        if req.finished or not out.token_ids:
            return KeptTokens(out)
        text = None
        for n in range(1, len(out.token_ids) + 1):
            (finish, reason, text_len), text = self._check_stop(req, out.token_ids[:n], text)
            if finish is not None:
                break
        if n < len(out.token_ids):  # the stop fell inside the accepted drafts: no bonus is kept
            out = cut_emitted(out, n)
        return KeptTokens(out, finish, reason, text_len)

    def _check_stop(self, req: Request, new: list[int], prev_text: str | None):
        """Does the last of ``new`` (tokens after the request's output) end the request?

        Args: prev_text: the text of the output up to ``new[:-1]`` when known (None: decoded here).
        Returns: ((status or None, stop_reason, stop_text_len), the output's text or None).
        """
        params, token = req.sampling_params, new[-1]
        num_output = req.num_output_tokens + len(new)
        text = None
        if num_output >= params.min_tokens:
            if token in self.eos_token_ids and not params.ignore_eos:
                return (RequestStatus.FINISHED_STOPPED, None, None), None
            if token in params.stop_token_ids:
                return (RequestStatus.FINISHED_STOPPED, token, None), None
            if params.stop and self.detokenize is not None:
                output = req.output_token_ids + new
                if prev_text is None:
                    prev_text = self.detokenize(output[:-1])
                text = self.detokenize(output)
                hit = find_stop(params.stop, text, len(prev_text))
                if hit is not None:
                    return (RequestStatus.FINISHED_STOPPED, hit[1], hit[0]), text
        if num_output >= params.max_tokens or req.num_prompt_tokens + num_output >= self.max_model_len:
            return (RequestStatus.FINISHED_LENGTH, None, None), text
        return (None, None, None), text


def cut_emitted(out: EmittedTokens, n: int) -> EmittedTokens:
    """``out`` ending at its n-th token (1 <= n <= its length): the token there stands where the
    target's own token stood, so the drafts before it count as proposed and accepted and none at
    or after it does (the module doc)."""
    if n >= len(out.token_ids):
        return out
    return EmittedTokens(out.token_ids[:n], min(out.num_draft_proposed, n - 1),
                         min(out.num_draft_accepted, n - 1), out.synthetic,
                         None if out.accepted_nodes is None else out.accepted_nodes[:n - 1],
                         min(out.num_speculative_tokens, n - 1))


def find_stop(stops: tuple[str, ...], text: str, prev_len: int) -> tuple[int, str] | None:
    """The earliest stop string completed by the text past ``prev_len`` characters (one ending
    there, possibly starting before): (where it starts, which string), or None. Occurrences that
    ended earlier were seen, or ignored below ``min_tokens``, by earlier checks."""
    hits = [(i, stop) for stop in stops if (i := text.find(stop, max(0, prev_len - len(stop) + 1))) >= 0]
    return min(hits) if hits else None


def eos_ids(tokenizer, hf_config) -> frozenset[int]:
    """EOS and chat end tokens: the tokenizer's EOS, the config's, and known end-of-turn markers."""
    ids = set()
    for source in (getattr(tokenizer, "eos_token_id", None), getattr(hf_config, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(source)
    if tokenizer is not None:
        vocab = tokenizer.get_vocab()
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"):
            if marker in vocab:
                ids.add(vocab[marker])
    return frozenset(ids)
