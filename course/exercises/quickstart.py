"""Notebook 00's exercise (notebooks/00_quickstart.ipynb): the batch-1 decode roofline."""

from __future__ import annotations

from course.checks import check_number


def decode_roofline_tok_s(weight_bytes: float, bandwidth_bytes_s: float) -> float:
    """Upper bound on batch-1 decode steps per second: every step reads every weight once."""
    return bandwidth_bytes_s / weight_bytes


def check_00_roofline(answer, weight_bytes: float, bandwidth_bytes_s: float = 25e9, quiet=False) -> str:
    return check_number("00 decode roofline (tokens/s)", answer,
                        decode_roofline_tok_s(weight_bytes, bandwidth_bytes_s),
                        rel=0.05, hint="Divide bytes per second by bytes read per step.", quiet=quiet)
