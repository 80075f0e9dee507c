"""Command line: ``python -m minispec generate | bench | simulate | profile | serve | info``.

One module per subcommand, each with ``add_parser(subparsers)`` and ``run(args)``, registered in
the explicit SUBCOMMANDS list below (the order ``--help`` shows). A subcommand parses its flags,
checks every one of them before anything slow happens (``preflight.py``: the error names the
flag; an unreachable hub model fails at once), builds configs (which validate), and calls the
library; no engine logic lives here. Invariant: a ValueError, which is how configs and library
calls report bad input, ends the command with its message and exit status 2, never a traceback.
See README (command line).
"""

from __future__ import annotations

import argparse
import sys

from minispec.cli import bench, generate, info, profile, serve, simulate
from minispec.models.machine import check_isa_variables

SUBCOMMANDS = (generate, bench, simulate, profile, serve, info)


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m minispec`` parser; each subcommand sets ``func`` to its ``run``."""
    parser = argparse.ArgumentParser(prog="python -m minispec", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]) and run the subcommand. Returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        check_isa_variables()  # a misspelt instruction-set switch would be ignored without a word
        return args.func(args)
    except ValueError as exc:
        print(f"minispec: error: {exc}", file=sys.stderr)
        return 2
