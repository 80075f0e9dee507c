"""``python -m minispec generate``: stream one completion to stdout, its metrics to stderr.

Text appears as the engine emits tokens; a half-decoded multi-byte character is held back until
the rest arrives, so stdout only ever gets valid text. See README (command line) and notebook 00.
"""

from __future__ import annotations

import sys

from minispec.cli.args import add_engine_args, add_structured_args, show_engine_log
from minispec.cli.preflight import check_engine_flags, sampling_params, structured_output
from minispec.build import build_engine
from minispec.core.support.metrics import request_metrics
from minispec.models.machine import format_machine_card, machine_card


def add_parser(subparsers) -> None:
    """Add the ``generate`` subcommand."""
    g = subparsers.add_parser("generate", help="stream one completion to stdout, stats to stderr")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    chat = g.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="chat", action="store_true", default=None,
                      help="apply the chat template (default when the model has one)")
    chat.add_argument("--no-chat", dest="chat", action="store_false")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="print the machine card and the engine's stack (executor, drafter, kernels) first")
    add_structured_args(g)
    add_engine_args(g)
    g.set_defaults(func=run)


def run(args) -> int:
    """Generate one completion, streaming it; returns the exit code.

    Raises: ValueError naming the flag, for any bad flag, before the model loads.
    """
    if not args.prompt.strip():
        raise ValueError("--prompt is empty: give the text to complete (with the chat template on, "
                         "the user's message)")
    params = sampling_params(args, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                             top_k=args.top_k, seed=args.seed, stop=tuple(args.stop or ()),
                             structured=structured_output(args))
    config = check_engine_flags(args)
    show_engine_log()
    engine = build_engine(config)
    if args.verbose:
        print(format_machine_card(machine_card(engine.runner.device)), file=sys.stderr)
        print(engine.describe(), file=sys.stderr)
    chat = args.chat if args.chat is not None else bool(getattr(engine.tokenizer, "chat_template", None))
    prompt = [{"role": "user", "content": args.prompt}] if chat else args.prompt
    rid = engine.add_request(prompt, params)
    req = engine.requests[rid]
    shown = ""
    while engine.has_unfinished():
        engine.step()
        text = engine.text(req) if req.finished else engine.tokenizer.decode(req.output_token_ids,
                                                                               skip_special_tokens=True)
        if not req.finished and text.endswith("\ufffd"):
            continue  # half of a multi-byte character: wait for the rest
        if text.startswith(shown) and len(text) > len(shown):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write("\n")
    print(_summary_line(args, req), file=sys.stderr)
    return 0


def _summary_line(args, req) -> str:
    """One line of the request's metrics: token counts, TTFT, TPOT, E2E, speculation."""
    m = request_metrics(req)
    tpot = f"{m['tpot_s'] * 1000:.1f} ms" if m["tpot_s"] else "-"
    line = (f"[minispec] {m['num_prompt_tokens']} prompt + {m['num_output_tokens']} output tokens, "
            f"finish={req.status.value}, TTFT {m['ttft_s'] * 1000:.0f} ms, TPOT {tpot}, "
            f"E2E {m['e2e_s']:.2f} s, {m['num_output_tokens'] / m['e2e_s']:.1f} tok/s")
    if m["acceptance_rate"] is not None:
        line += (f", spec={args.spec} k={args.k}: acceptance rate {m['acceptance_rate']:.2f}, "
                 f"mean accepted length {m['mean_accepted_length']:.2f}")
    if req.synthetic:
        line += " (synthetic drafter: the text is not model output)"
    return line
