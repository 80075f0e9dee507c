"""Notebook 01's exercise (notebooks/01_decode_is_memory_bound.ipynb): the roofline's ridge point."""

from __future__ import annotations

from course.checks import check_number


def ridge_point_tokens(flops_per_s: float, bandwidth_bytes_s: float, bytes_per_weight: float) -> float:
    """Tokens per step where a step's weight FLOPs (2 per weight per token) take as long as reading
    the weights once: 2 * n / flops = bytes_per_weight / bandwidth (Williams et al. 2009, roofline)."""
    return flops_per_s * bytes_per_weight / (2 * bandwidth_bytes_s)


def check_01_ridge(answer, flops_per_s: float, bandwidth_bytes_s: float,
                   bytes_per_weight: float, quiet=False) -> str:
    return check_number("01 ridge point (tokens per step)", answer,
                        ridge_point_tokens(flops_per_s, bandwidth_bytes_s, bytes_per_weight), rel=0.05,
                        hint="Set compute time 2*P*n/FLOPs equal to memory time P*bytes/bandwidth and solve "
                             "for n.",
                        quiet=quiet)
