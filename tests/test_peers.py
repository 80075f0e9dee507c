"""bench/peers/peers.py's child-process runner: a peer that crashes is reported at once, with its exit code."""

import os
import signal
import time

from conftest import load_bench_script


def crash(task, queue):
    os.kill(os.getpid(), signal.SIGSEGV)


def answer(task, queue):
    queue.put([task["x"] * 2])


def test_a_crashed_child_is_reported_within_seconds_not_after_the_timeout():
    """Failed before the fix: a segfaulted llama.cpp child was waited on for the whole timeout
    (1,800 s per crashed setting on an Intel Xeon)."""
    peers = load_bench_script("peers")
    start = time.monotonic()
    results, code = peers.child_result(crash, {}, timeout_s=120)
    assert results is None and code == -signal.SIGSEGV
    assert time.monotonic() - start < 30


def test_a_child_that_answers_and_exits_gives_its_result():
    results, code = load_bench_script("peers").child_result(answer, {"x": 21}, timeout_s=120)
    assert results == [42] and code == 0
