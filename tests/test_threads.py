"""course.threads: the kernel gives up a thread only when all threads are clearly slower
(another program busy on a core), and MINISPEC_THREADS is checked and obeyed."""

import pytest
import torch

from course import threads as th


@pytest.fixture(autouse=True)
def restore_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv(th.THREADS_ENV, raising=False)
    monkeypatch.setattr(th, "_START", [])
    yield
    torch.set_num_threads(before)


def fake_probe(per_thread_s):
    calls = []

    def probe(threads, ops=60):
        calls.append(threads)
        torch.set_num_threads(threads)
        return per_thread_s[threads] * ops
    return probe, calls


def test_a_busy_core_makes_the_kernel_use_one_thread_fewer():
    torch.set_num_threads(2)
    probe, calls = fake_probe({2: 0.005, 1: 0.001})   # two threads 5x slower: one core is taken
    threads, why = th.pick_threads(probe=probe)
    assert threads == 1 and torch.get_num_threads() == 1 and "busy" in why and "5.0x" in why
    assert calls[2:] == [2, 1, 1, 2, 2, 1]            # interleaved rounds after the warm-up


def test_a_quiet_machine_keeps_every_thread_even_when_they_barely_help():
    torch.set_num_threads(2)
    probe, _ = fake_probe({2: 0.0012, 1: 0.001})      # 1.2x: inside the margin, not a busy core
    assert th.pick_threads(probe=probe) == (2, "all cores") and torch.get_num_threads() == 2


def test_one_thread_is_not_probed_and_a_bad_override_names_the_value(monkeypatch):
    torch.set_num_threads(1)
    probe, calls = fake_probe({1: 0.001})
    assert th.pick_threads(probe=probe)[0] == 1 and calls == []
    monkeypatch.setenv(th.THREADS_ENV, "0")
    with pytest.raises(ValueError, match="MINISPEC_THREADS='0'.*from 1 to"):
        th.pick_threads(probe=probe)
    monkeypatch.setenv(th.THREADS_ENV, "1")
    assert th.pick_threads(probe=probe) == (1, "set by MINISPEC_THREADS")
