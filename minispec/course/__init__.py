"""Helpers for the notebooks: set-up, quizzes, exercise checks, plots and explorers.

Kept out of the engine so the engine stays free of notebook concerns. ``MINISPEC_FAST=1`` (read
here only) shrinks notebook workloads so CI can execute every notebook quickly.
"""

from __future__ import annotations

import os
import platform


def fast_mode() -> bool:
    """True when MINISPEC_FAST=1: notebooks use smaller workloads (CI, quick checks)."""
    return os.environ.get("MINISPEC_FAST") == "1"


def setup(seed: int = 0) -> dict:
    """Seed torch, pick the device, and print versions. Returns {"device", "fast", "threads"}."""
    import torch
    import transformers

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {"device": device, "fast": fast_mode(), "threads": torch.get_num_threads()}
    name = torch.cuda.get_device_name(0) if device == "cuda" else platform.processor() or platform.machine()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, device {device} ({name}), "
          f"{info['threads']} CPU threads, fast mode {'on' if info['fast'] else 'off'}")
    return info
