"""``python -m minispec info``: the machine card, with no model loaded.

What this machine is, the threads torch uses, ATen's CPU capability, whether oneDNN is present, and
how each weight format runs here: natively, emulated (slower than its bytes promise) or not at
all (minispec/models/machine.py). ``generate -v`` prints the same card and the engine's stack.
"""

from __future__ import annotations

from minispec.models.loader import pick_device
from minispec.models.machine import format_machine_card, machine_card


def add_parser(subparsers) -> None:
    """Add the ``info`` subcommand."""
    p = subparsers.add_parser("info", help="this machine: CPU capability, oneDNN, which weight formats "
                                           "run natively here")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Print the machine card. Raises: ValueError naming --device for a device that is not here."""
    try:
        device = pick_device(args.device)
    except ValueError as exc:
        raise ValueError(f"--device: {exc}") from None
    print(format_machine_card(machine_card(device)))
    return 0
