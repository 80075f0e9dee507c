"""Check a subcommand's flags before anything slow happens, so that bad input fails at once and
names the flag that carried it.

Configs and SamplingParams report a bad value as ``"field=value: what is allowed"``; here that
message gets the flag in front (``--max-num-seqs: max_num_seqs=0: must be an integer >= 1``).
The model is checked too: an alias, a directory or ``random:PRESET`` is fine; a hub name that is
not in the local Hugging Face cache while the hub cannot be reached fails in a second with the
aliases and the hint that hub names need a connection, instead of a minute of download retries.
``simulate`` runs the same checks, with its model and draft read as model shapes and the device
flags refused by name (``--device``, ``--kernels``, ``--weights``, ``--cuda-graphs``: it runs no
model; the hardware and engine mode it prices come from ``--hardware NAME@MODE``).
Every check raises ValueError, which the CLI prints with exit status 2. See README (command line).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from urllib.parse import urlparse

import huggingface_hub
from huggingface_hub import constants as hub_constants

from minispec.tools.bench import spec_configs
from minispec.cli.args import DEVICE_FLAGS, engine_config
from minispec.base.config import EngineConfig, SpecConfig
from minispec.build.pool import use_compile
from minispec.models.loader import ALIASES, pick_device, resolve_model
from minispec.models.config import load_model_config
from minispec.models.lowbit import check_int4_widths, check_lowbit
from minispec.core.request import SamplingParams
from minispec.sim.drafters import FREE_DRAFTERS, HEADS, resolve_drafter
from minispec.cost.modelspec import load_model_spec
from minispec.speculation.adaptive import ADAPTIVE_POLICIES
from minispec.speculation.estimate import parse_prior
from minispec.speculation.policy import make_step_policy
from minispec.base.structured_output import StructuredOutput

# config fields whose flag is not "--" + the field with dashes
FLAG_OF_FIELD = {"num_speculative_tokens (k)": "--k", "num_speculative_tokens": "--k",
                 "draft_model": "--draft", "spec method": "--spec"}


def flag_error(exc: ValueError, args: argparse.Namespace) -> ValueError:
    """``exc`` with the flag that set the bad field in front of its message (unchanged when its
    message names no field of ``args``)."""
    message = str(exc)
    field = next((f for f in FLAG_OF_FIELD if message.startswith(f)), None)
    if field is None:
        head = message.split("=", 1)[0]
        field = head if head.isidentifier() and hasattr(args, head) else None
    if field is None:
        return exc
    flag = FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))
    return ValueError(f"{flag}: {message}")


def sampling_params(args: argparse.Namespace, **fields) -> SamplingParams:
    """SamplingParams(**fields); a bad value raises ValueError naming its flag."""
    try:
        return SamplingParams(**fields)
    except ValueError as exc:
        raise flag_error(exc, args) from None


def structured_output(args: argparse.Namespace) -> StructuredOutput | None:
    """The StructuredOutput ``--json-schema FILE`` or ``--regex PATTERN`` asks for (None: neither),
    compiled now. Raises: ValueError naming the flag: a file that is missing or not JSON, a schema
    the grammar library cannot compile, a pattern that does not parse or matches no string."""
    path, pattern = getattr(args, "json_schema", None), getattr(args, "regex", None)
    if path is None and pattern is None:
        return None
    flag = f"--json-schema {path}" if path is not None else f"--regex {pattern!r}"
    try:
        if path is None:
            return StructuredOutput("regex", pattern)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"cannot read the file ({exc.strerror})") from None
        return StructuredOutput("json_schema", text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def check_engine_flags(args: argparse.Namespace, spec: str | None = None, prefix_caching: bool | None = None,
                       simulated: bool = False) -> EngineConfig:
    """The EngineConfig the engine flags describe, after checking all of them: the config's own
    validation, ``--policy`` (even with speculation off), ``--device`` and ``--cuda-graphs``
    (CUDA graphs need a CUDA device), the draft flags and ``--model``. ``spec`` and
    ``prefix_caching`` override their flags (bench and simulate check one setting of their
    lists). ``simulated`` (simulate): no device, so ``--model`` and ``--draft`` name model shapes
    (``check_simulated``).

    Raises: ValueError naming the flag.
    """
    try:
        config = engine_config(args, spec, prefix_caching)
    except ValueError as exc:
        raise flag_error(exc, args) from None
    check_output_paths(args)
    check_policy(args.policy, args.k)
    if simulated:
        check_simulated(args)
        return config
    try:
        device = pick_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    if config.cuda_graphs and device.type != "cuda":
        raise ValueError("--cuda-graphs on: CUDA graphs need a CUDA device, and this run's device is "
                         f"{device.type} ({'--device ' + args.device if args.device else 'no CUDA here'}); "
                         "leave --cuda-graphs out or run on --device cuda")
    if config.compile:
        try:
            use_compile(True, device)
        except ValueError as exc:
            raise ValueError(f"--compile on: {str(exc).removeprefix('compile=True: ')}") from None
    if config.weights in ("int4", "int8") and config.kernels == "fast":
        check_lowbit(config.weights, device)  # its message names --weights
    check_draft_flags(args)
    check_model(args.model)
    if config.weights == "int4":  # the draft's weights take the same format
        for name in (args.model, config.spec.draft_model if config.spec.method == "draft" else None):
            if name:
                check_int4_model(name)
    return config


def check_output_paths(args: argparse.Namespace) -> None:
    """--json, --plot and --output name files written after the run: a folder that does not exist or
    cannot be written is refused before it, not after. Raises: ValueError naming the flag."""
    for flag in ("json", "plot", "output"):
        value = getattr(args, flag, None)
        folder = os.path.dirname(os.path.abspath(value)) if value else None
        if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            why = "cannot be written" if os.path.isdir(folder) else "does not exist"
            raise ValueError(f"--{flag} {value}: the folder {folder} {why}; make it or name another")


def check_int4_model(name: str) -> None:
    """``--weights int4`` against the checkpoint's config, read without its weights (a preset, an
    alias or a directory's config.json; a hub name is checked when it loads). Raises: ValueError
    naming ``--weights int4``, the width and what to use instead."""
    try:
        cfg = load_model_config(name)
    except ValueError:
        return  # no config to read before loading: the loader's own check names the width then
    check_int4_widths(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim)


def check_simulated(args: argparse.Namespace) -> None:
    """The engine flags as the simulator reads them: ``--model`` and ``--draft`` name model shapes
    (a preset, a config.json or a checkpoint directory; a draft also a head or a lookup), and the
    flags of a device (``DEVICE_FLAGS``) are refused: the simulator runs no model, and the hardware
    and engine mode it prices, CUDA graphs or not, are ``--hardware NAME@MODE``'s (or
    ``--engine-mode``'s).

    Raises: ValueError naming the flag.
    """
    for name in DEVICE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {value}: simulate runs no model, so it reads no device, kernels, "
                             "weights or CUDA graphs switch: the hardware and engine mode it prices come "
                             "from --hardware NAME@MODE (e.g. h100@sglang-0.5-cuda-graphs) or --engine-mode; "
                             f"leave {flag} out")
    try:
        target = load_model_spec(args.model)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    if args.draft:
        try:
            resolve_drafter(args.draft, target, target.weight_dtype)
        except ValueError as exc:
            raise ValueError(f"--draft: {exc}; or a head sized from the target ({', '.join(HEADS)}) or a "
                             f"lookup ({', '.join(FREE_DRAFTERS)})") from None


def check_spec_settings(args: argparse.Namespace, methods: str, alpha: float) -> list[SpecConfig]:
    """The SpecConfig of each speculation setting in ``methods`` (bench and simulate sweep a
    comma-separated --spec list), from the speculation flags and ``alpha``.

    Raises: ValueError naming the flag (an empty list names --spec).
    """
    try:
        specs = spec_configs(methods, args.k, args.policy, args.draft, alpha, args.draft_confidence_threshold,
                             args.draft_topk, args.num_draft_tokens)
    except ValueError as exc:
        raise flag_error(exc, args) from None
    if not specs:
        raise ValueError(f"--spec {methods!r}: name at least one of off, ngram, draft, synthetic")
    return specs


def check_draft_flags(args: argparse.Namespace) -> None:
    """``--draft`` and ``--draft-confidence-threshold`` are read only by ``--spec draft`` (for
    bench: by a list naming it); given without it they would be ignored without a word. An empty
    ``--draft`` would fall back to the default draft. Raises: ValueError naming the flag."""
    draft, threshold = getattr(args, "draft", None), getattr(args, "draft_confidence_threshold", 0.0)
    if draft is not None and not draft.strip():
        raise ValueError(f"--draft {draft!r}: empty; give an alias, a directory or a hub name, or leave the "
                         f"flag out for the target's default draft")
    spec = getattr(args, "spec", "off")
    if "draft" in [m.strip() for m in spec.split(",")]:
        return
    for flag, value, unset in (("--draft", draft, None), ("--draft-confidence-threshold", threshold, 0.0)):
        if value != unset:
            raise ValueError(f"{flag} {value}: read only by --spec draft, and --spec is {spec!r}; add draft "
                             f"to --spec or leave {flag} out")


def check_policy(text: str, k: int) -> None:
    """Raise ValueError naming ``--policy`` unless ``text`` spells a policy (POLICY_HELP)."""
    name, _, arg = text.partition(":")
    try:
        if name in ADAPTIVE_POLICIES:
            parse_prior(arg, name)  # its cost model is built with the engine
        else:
            make_step_policy(text, k)
    except ValueError as exc:
        raise ValueError(f"--policy: {exc}") from None


def check_positive(args: argparse.Namespace, **values) -> None:
    """Each named flag value (``num_requests=...``) must be a number > 0 (None: not given)."""
    for name, value in values.items():
        items = value if isinstance(value, (list, tuple)) else [value]
        for v in items:
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be "
                                 f"{'an integer >= 1' if isinstance(v, int) else 'a number > 0'}")


def check_model(name: str, timeout_s: float = 3.0) -> None:
    """Fail at once for a model that cannot load: not an alias, a directory, ``random:PRESET`` or a
    hub name; or a hub name that is not cached locally while the hub cannot be reached (one
    connection attempt of ``timeout_s`` seconds, no retries).

    Raises: ValueError naming ``--model``, the aliases and what else would work.
    """
    if name.startswith("random:") or name in ALIASES or os.path.isdir(name):
        return
    try:
        resolve_model(name)
    except ValueError as exc:
        raise ValueError(f"--model: {exc}") from None
    if _in_hub_cache(name) or _hub_reachable(timeout_s):
        return
    raise ValueError(
        f"--model {name!r}: a hub name needs a connection to {hub_constants.ENDPOINT}, which cannot be "
        "reached (offline), and the model is not in the local Hugging Face cache. Offline, use an alias "
        f"({', '.join(ALIASES)}) or a local directory")


def _in_hub_cache(name: str) -> bool:
    """True when the local Hugging Face cache holds the repository's config.json."""
    return isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str)


def _hub_reachable(timeout_s: float) -> bool:
    """One TCP connection to the hub endpoint (``HF_ENDPOINT``); False offline (``HF_HUB_OFFLINE``)."""
    if hub_constants.HF_HUB_OFFLINE:
        return False
    url = urlparse(hub_constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False
