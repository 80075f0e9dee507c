"""``python -m minispec serve``: the OpenAI-compatible server on uvicorn, plus a launcher.

Shutdown, step by step: on SIGINT or SIGTERM the engine stops taking requests (503) and lets
the ones in flight run for ``--shutdown-timeout`` seconds; whatever is still running then ends
with finish_reason "abort", so every stream closes with ``data: [DONE]``; uvicorn waits for those
responses, then the lifespan stops the engine thread. ``launch_server`` starts the same command
as a child process and waits for /health, for tests and notebooks that need a real server.
Binds 127.0.0.1 unless told otherwise: an inference server has no authentication.
See docs/production.md.
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


def register(subparsers, add_engine_args, engine_config) -> None:
    """Add the ``serve`` subcommand (called by minispec.cli.build_parser)."""
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="name clients send as 'model' (default: --model)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may run after SIGINT/SIGTERM before they are aborted")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_args(p)
    p.set_defaults(func=lambda args: cmd_serve(args, engine_config))


def cmd_serve(args, engine_config) -> int:
    import uvicorn

    from minispec.engine import build_engine
    from minispec.server import create_app

    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: must be in 1..65535")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout {args.shutdown_timeout}: must be >= 0 seconds")
    engine = build_engine(engine_config(args))
    name = args.served_model_name or args.model
    app = create_app(engine, name, aliases=(args.model,), drain_grace_s=args.shutdown_timeout)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.engine_loop.begin_drain(app.state.drain_grace_s)
            super().handle_exit(sig, frame)

    # in-flight requests are aborted at --shutdown-timeout; uvicorn's own limit only backs that up
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=int(args.shutdown_timeout) + 5)
    print(f"[minispec] serving {name!r} on http://{args.host}:{args.port}/v1 "
          f"(spec={engine.config.spec.method}, KV blocks={engine.block_manager.num_blocks})", file=sys.stderr)
    # uvicorn re-raises the signal after a graceful shutdown; make SIGTERM end like Ctrl-C, with exit 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        Server(config).run()
    except KeyboardInterrupt:
        pass
    return 0


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
    cmd = [sys.executable, "-m", "minispec", "serve", "--model", model, "--host", host, "--port", str(port), *args]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # so the child finds minispec
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    child_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env)
    server = ServerProcess(proc, f"http://{host}:{port}", log.name)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"minispec serve exited with code {proc.returncode}:\n{server.log()[-3000:]}")
            try:
                server.health()
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"minispec serve did not answer within {timeout_s} s:\n{server.log()[-3000:]}")
                time.sleep(0.2)
        yield server
    finally:
        server.stop()
        log.close()
        os.unlink(log.name)
