"""``python -m minispec serve``: the OpenAI-compatible server (minispec/serve/) on uvicorn.

Shutdown, step by step: on SIGINT or SIGTERM the engine stops taking requests (503) and lets
the ones in flight run for ``--shutdown-timeout`` seconds; whatever is still running then ends
with finish_reason "abort", so every stream closes with ``data: [DONE]``; uvicorn waits for those
responses, then the lifespan stops the engine thread. Tests and notebooks start this command as a
child process with ``minispec.serve.launch_server``.
Binds 127.0.0.1 unless told otherwise: an inference server has no authentication.
See docs/production.md.
"""

from __future__ import annotations

import signal
import sys

import uvicorn

from minispec.cli.args import add_engine_args, show_engine_log
from minispec.cli.preflight import check_engine_flags
from minispec.build import build_engine
from minispec.serve.app import create_app


def add_parser(subparsers) -> None:
    """Add the ``serve`` subcommand."""
    p = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/completions, "
                                            "/v1/chat/completions)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="name clients send as 'model' (default: --model)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds in-flight requests may run after SIGINT/SIGTERM before they are aborted")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"])
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    """Build the engine and serve it until SIGINT / SIGTERM; returns 0 after a graceful shutdown."""
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: must be in 1..65535")
    if args.shutdown_timeout < 0:
        raise ValueError(f"--shutdown-timeout {args.shutdown_timeout}: must be >= 0 seconds")
    config = check_engine_flags(args)
    show_engine_log()
    engine = build_engine(config)
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
          f"(spec={engine.config.spec.method}, KV blocks={engine.block_manager.num_blocks}, prefix caching "
          f"{'on' if engine.config.enable_prefix_caching else 'off'})", file=sys.stderr)
    # uvicorn re-raises the signal after a graceful shutdown; make SIGTERM end like Ctrl-C, with exit 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        Server(config).run()
    except KeyboardInterrupt:
        pass
    return 0
