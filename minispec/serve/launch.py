"""Start ``python -m minispec serve`` as a child process, for tests and notebooks that need a real server.

``launch_server`` waits until /health answers, yields a handle, and stops the child on exit
(SIGINT, the graceful shutdown of minispec/cli/serve.py, then SIGKILL after a timeout), so no
server outlives the block that started it. See docs/production.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# the directory holding the minispec package, so the child imports this copy of it
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``python -m minispec serve`` child process. ``url`` is its base URL (no /v1)."""

    def __init__(self, proc: subprocess.Popen, url: str, log_path: str):
        self.proc = proc
        self.url = url
        self.log_path = log_path

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def health(self) -> dict:
        """GET /health as a dict (its body also comes with a 503 while draining)."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            return json.load(exc)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> int:
        """Send ``sig``, wait for exit (kill after ``timeout_s``). Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@contextlib.contextmanager
def launch_server(model: str, args: list[str] = (), port: int | None = None, host: str = "127.0.0.1",
                  timeout_s: float = 120.0, env: dict | None = None):
    """Start ``python -m minispec serve`` in a child process, wait until /health answers, stop it after.

    Args:
        model: alias or checkpoint directory (``--model``).
        args: more ``serve`` flags, e.g. ["--num-kv-blocks", "512"].
        timeout_s: how long to wait for the model to load.
        env: extra environment variables for the child (e.g. {"OMP_NUM_THREADS": "1"}).
    Yields: a :class:`ServerProcess`. Raises: RuntimeError (with the log) if it dies or times out.
    """
    port = port or free_port(host)
    log = tempfile.NamedTemporaryFile("w", prefix="minispec-serve-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "minispec", "serve", "--model", model,
           "--host", host, "--port", str(port), *args]
    path = os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    server = ServerProcess(proc, f"http://{host}:{port}", log.name)
    try:
        _wait_healthy(server, timeout_s)
        yield server
    finally:
        server.stop()
        log.close()
        os.unlink(log.name)


def _wait_healthy(server: ServerProcess, timeout_s: float) -> None:
    """Poll /health until it answers. Raises: RuntimeError with the log's tail if the child exits or times
    out."""
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError("minispec serve exited with code "
                               f"{server.proc.returncode}:\n{server.log()[-3000:]}")
        try:
            server.health()
            return
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise RuntimeError(f"minispec serve did not answer within "
                                   f"{timeout_s} s:\n{server.log()[-3000:]}")
            time.sleep(0.2)
