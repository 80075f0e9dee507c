"""How many CPU threads a notebook's kernel uses: one fewer while another program is busy on a core.

PyTorch runs each operator on every core by default (``torch.get_num_threads()``), and each
parallel operator ends at a barrier where all of its threads must arrive. When another program
keeps one core busy, the operating system shares that core between the program and one of the
kernel's threads in time slices of a few milliseconds, and every barrier waits for the slice: a
2-core machine with one core taken ran the course's 00 notebook 13x slower (206 s against 15 s,
``bench/course/course_budget.py --busy``, 2026-12-05), where one thread on the free core is only a little
slower than two on a quiet machine. So :func:`pick_threads` times a few decode-sized matrix
products with all threads and with one fewer, in interleaved rounds, and keeps the faster.
The choice is made once, when a notebook calls ``setup()``; ``MINISPEC_THREADS`` overrides it.
"""

from __future__ import annotations

import os
import statistics
import time

THREADS_ENV = "MINISPEC_THREADS"
SLOWER = 1.25  # all threads must take this much longer than one fewer before the kernel gives one up
_START: list[int] = []  # torch's thread count before the first pick (a second setup() starts from it)


def probe_s(threads: int, ops: int = 60) -> float:
    """Seconds for ``ops`` products of a [16, 576] by [576, 1536] float32 matrix (the shape of a
    16-token step through one of SmolLM2-135M's MLP projections) on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    x, w = torch.ones(16, 576), torch.ones(576, 1536)
    start = time.perf_counter()
    for _ in range(ops):
        x @ w
    return time.perf_counter() - start


def pick_threads(rounds: int = 3, probe=probe_s) -> tuple[int, str]:
    """Set torch's thread count for this process and say why. Returns (threads, reason).

    Without ``MINISPEC_THREADS``: keeps all of torch's threads unless, in ``rounds`` interleaved
    probes (:func:`probe_s`), their median took over 1.25x one fewer thread's; then uses one fewer.
    Raises: ValueError when ``MINISPEC_THREADS`` is not a whole number from 1 to the core count.
    """
    import torch

    cores = os.cpu_count() or 1
    chosen = os.environ.get(THREADS_ENV)
    if chosen is not None:
        if not chosen.strip().isdigit() or not 1 <= int(chosen) <= cores:
            raise ValueError(f"{THREADS_ENV}={chosen!r}: must be a whole number of threads from 1 to {cores} "
                             "(this machine's cores)")
        torch.set_num_threads(int(chosen))
        return int(chosen), f"set by {THREADS_ENV}"
    if not _START:
        _START.append(torch.get_num_threads())
    n = _START[0]
    if n <= 1:
        return n, "one thread"
    for t in (n, n - 1):  # warm-up: first calls pay for allocations
        probe(t, ops=5)
    times: dict[int, list[float]] = {n: [], n - 1: []}
    for r in range(rounds):
        for t in ((n, n - 1) if r % 2 == 0 else (n - 1, n)):
            times[t].append(probe(t))
    ratio = statistics.median(times[n]) / statistics.median(times[n - 1])
    if ratio > SLOWER:
        torch.set_num_threads(n - 1)
        return n - 1, (f"another program is busy on a core: {n} threads took {ratio:.1f}x as long as {n - 1} "
                       f"in a short probe, so this kernel uses {n - 1} (set {THREADS_ENV} to choose)")
    torch.set_num_threads(n)
    return n, "all cores"
