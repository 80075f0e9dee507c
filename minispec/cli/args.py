"""Argument helpers every subcommand shares: comma-separated lists, the engine flags, EngineConfig.

Flags only describe; ``engine_config`` turns them into an EngineConfig, whose ``__post_init__``
validates them, so a bad flag fails with the config's own message (the CLI prints it, exit 2).
See README (command line).
"""

from __future__ import annotations

import argparse
import logging
import sys

from minispec.base.config import EngineConfig, SchedulerConfig, SpecConfig
from minispec.models.kernels import KERNELS, WEIGHT_FORMATS
from minispec.speculation.policy import POLICY_HELP

# the flags of the device a real engine runs on (args' names): simulate runs no model and refuses them
DEVICE_FLAGS = ("device", "kernels", "weights", "cuda_graphs", "compile")


def ints(text: str) -> list[int]:
    """Parse "1,4,16" into [1, 4, 16]; every value >= 1. Raises: argparse.ArgumentTypeError."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, "
                                         "e.g. 1,4,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every value must be an integer >= 1")
    return values


def switches(text: str) -> list[bool]:
    """Parse "off,on" into [False, True]. Raises: argparse.ArgumentTypeError."""
    values = [x.strip() for x in text.split(",") if x.strip()]
    if not values or any(v not in ("on", "off") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: expected on, off or a comma-separated list of them, "
                                         "e.g. off,on")
    return [v == "on" for v in values]


def floats(text: str) -> list[float]:
    """Parse "0.5,1,2" into [0.5, 1.0, 2.0]. Raises: argparse.ArgumentTypeError."""
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated numbers, "
                                         "e.g. 0.5,1,2") from None


def show_engine_log() -> None:
    """Print the engine's log on stderr from INFO up, as ``[minispec] message``: the start-up line
    on the KV pools (what the memory budget covers) and warnings such as a drafter that never pays.
    Commands that build one engine call it just before building; once per process."""
    logger = logging.getLogger("minispec")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[minispec] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def add_structured_args(p: argparse.ArgumentParser) -> None:
    """Add ``--json-schema FILE`` and ``--regex PATTERN`` (one or the other): every request's output
    must match it (minispec/base/structured_output.py); ``preflight.structured_output`` reads them."""
    g = p.add_argument_group("structured output").add_mutually_exclusive_group()
    g.add_argument("--json-schema", default=None, metavar="FILE",
                   help="a JSON schema file the output must match (JSON with \", \" and \": \" separators)")
    g.add_argument("--regex", default=None, metavar="PATTERN",
                   help="a regular expression (Rust syntax) the whole output must match")


def add_engine_args(p: argparse.ArgumentParser, simulated: bool = False) -> None:
    """Add the "engine" and "speculation" flag groups that ``engine_config`` reads. ``simulated``
    (simulate): the flags of the device a model runs on (``DEVICE_FLAGS``) are left out of the help
    and default to None, and preflight refuses them by name: the simulator runs no model, and the
    hardware and engine mode it prices, CUDA graphs or not, come from ``--hardware NAME@MODE``."""
    g = p.add_argument_group("engine")

    def device_flag(name: str, **kwargs) -> None:
        if simulated:
            kwargs.update(help=argparse.SUPPRESS, default=None)
        g.add_argument(name, **kwargs)

    g.add_argument("--model", default="smollm2-135m-instruct", help="alias, local directory or hub name")
    device_flag("--device", default=None, help="cpu, cuda, cuda:N (default: CUDA when present)")
    g.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--num-kv-blocks", type=int, default=None)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    g.add_argument("--max-num-seqs", type=int, default=64)
    g.add_argument("--no-chunked-prefill", action="store_true", help="prefill each prompt in one step")
    device_flag("--kernels", choices=KERNELS, default="fast",
                help="fast: oneDNN pre-packed weights on CPU (a verify step costs about a decode); "
                     "reference: the plain x @ W every equivalence test checks")
    device_flag("--weights", choices=WEIGHT_FORMATS, default=None,
                help="target and draft weights: float32, bfloat16, int8 or int4 (the bundled checkpoint's "
                     "own 4-bit codes, a sixth of float32's bytes; both low-bit formats run bfloat16 "
                     "activations on CPU); default: the dtype")
    g.add_argument("--prefix-caching", type=switches, default=[True], metavar="on|off",
                   help="reuse the K/V of prompt prefixes an earlier request computed (default on, simulate: "
                        "off; bench and simulate take a comma-separated list, e.g. off,on)")
    device_flag("--cuda-graphs", choices=["on", "off"], default=None,
                help="record decode and verify steps as CUDA graphs and replay them (default: on for CUDA; "
                     "CUDA only)")
    device_flag("--compile", choices=["on", "off"], default=None,
                help="compile the decode and verify step once per batch bucket with torch.compile (CPU "
                     "only, needs a C++ compiler; default off: a bucket's first compile takes tens of "
                     "seconds)")
    s = p.add_argument_group("speculation")
    s.add_argument("--spec", default="off", help="off | ngram | draft | synthetic (bench: "
                                                 "comma-separated list)")
    s.add_argument("--k", type=int, default=4, help="draft tokens per verify step (a draft tree's depth)")
    s.add_argument("--draft-topk", type=int, default=1,
                   help="children per draft-tree node (SGLang's --speculative-eagle-topk); 1 = a chain")
    s.add_argument("--num-draft-tokens", type=int, default=None,
                   help="nodes of the draft tree verified per step (k..64, at most topk + (k - 1) x topk^2; "
                        "default k: a chain)")
    s.add_argument("--draft", default=None, help="draft model for --spec draft; in simulate also a head "
                   "sized from the target (eagle-head, eagle3-head, mtp) or ngram (a lookup, no forward)")
    s.add_argument("--alpha", type=float, default=0.6, help="per-position acceptance probability "
                                                            "for --spec synthetic")
    s.add_argument("--draft-confidence-threshold", type=float, default=0.0,
                   help="--spec draft drafts a position only while the draft's top probability there is at "
                        "least this (in [0, 1); 0 = always k tokens): fewer, likelier drafts, "
                        "a narrower verify")
    s.add_argument("--policy", default="always", help=POLICY_HELP)


def engine_config(args: argparse.Namespace, spec: str | None = None,
                  prefix_caching: bool | None = None) -> EngineConfig:
    """The EngineConfig the engine flags describe; ``spec`` and ``prefix_caching`` override
    ``--spec`` and ``--prefix-caching`` (bench and simulate sweep them).

    Raises: ValueError from the config's validation, or a list given to ``--prefix-caching``.
    """
    if prefix_caching is None:
        flags = getattr(args, "prefix_caching", [True])
        if len(flags) != 1:
            raise ValueError(f"--prefix-caching: {len(flags)} settings given; give on or off (lists are for "
                             "bench and simulate)")
        prefix_caching = flags[0]
    max_len = args.max_model_len
    budget = args.max_num_batched_tokens
    if args.no_chunked_prefill:
        budget = max(budget, max_len or 8192)
    return EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, seed=args.seed, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, max_model_len=max_len,
        kernels=getattr(args, "kernels", None) or "fast", weights=getattr(args, "weights", None),
        enable_prefix_caching=prefix_caching,
        cuda_graphs={"on": True, "off": False, None: None}[getattr(args, "cuda_graphs", None)],
        compile={"on": True, "off": False, None: None}[getattr(args, "compile", None)],
        scheduler=SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=args.max_num_seqs,
                                  enable_chunked_prefill=not args.no_chunked_prefill),
        spec=SpecConfig(method=spec or args.spec, num_speculative_tokens=args.k, policy=args.policy,
                        draft_model=args.draft, alpha=args.alpha,
                        draft_confidence_threshold=getattr(args, "draft_confidence_threshold", 0.0),
                        draft_topk=getattr(args, "draft_topk", 1),
                        num_draft_tokens=getattr(args, "num_draft_tokens", None)))
