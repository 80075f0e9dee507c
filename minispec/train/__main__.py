"""``python -m minispec.train``: distil and ship minispec's draft (the command is in command.py)."""

from minispec.train.command import main

if __name__ == "__main__":
    raise SystemExit(main())
