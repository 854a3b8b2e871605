"""`kernelbay serve [MODEL]`: the OpenAI-compatible HTTP server (default model: the embedded demo).

Contributed to the `kernelbay` CLI host through the `kernelbay.commands` entry point `serve`. SIGTERM (or Ctrl-C)
stops accepting connections, lets running requests finish for --shutdown-timeout seconds, aborts the rest, and
exits 0."""

from __future__ import annotations

import signal
import socket
import sys

from kernelbay.cli import COMMAND_SUMMARIES
from kernelbay.errors import InputError
from kernelbay_engine.cli import add_engine_arguments, engine_options, kv_cache_memory_argument

DEFAULT_MAX_NUM_SEQS = 64


def add_serve_command(parser):
    """The `kernelbay.commands` hook: add `serve`'s arguments to its parser, return its handler."""
    parser.description = COMMAND_SUMMARIES["serve"]
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free one)")
    parser.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
    parser.add_argument(
        "--served-model-name", metavar="NAME", help="the model's name in the API (default: the folder's name)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=DEFAULT_MAX_NUM_SEQS,
        metavar="N",
        help=f"sequences decoded together in one step (default {DEFAULT_MAX_NUM_SEQS})",
    )
    parser.add_argument(
        "--max-queued",
        type=int,
        default=256,
        metavar="N",
        help="sequences that may wait beyond the running batch; past that, 503 with Retry-After (default 256)",
    )
    parser.add_argument("--max-model-len", type=int, metavar="N", help="context length (default: the model's)")
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=4 * 1024 * 1024,
        metavar="N",
        help="largest request body; past it, 413 (default 4 MiB)",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long running requests may finish before they are aborted (default 30)",
    )
    return serve


def serve(args) -> int:
    from kernelbay_engine.inputs import check_model_folder, demo_model_folder

    folder = check_model_folder(args.model if args.model else demo_model_folder())
    config = serve_config(args, args.served_model_name or (folder.name if args.model else "kernelbay/demo"))
    args.kv_cache_memory = kv_cache_memory_argument(args.kv_cache_memory)  # bad flags fail before torch loads
    listening = listen(args.host, args.port)  # a taken port fails before the model loads
    try:
        llm = build_serving_llm(args, folder)
    except BaseException:
        listening.close()
        raise
    return run_server(llm, config, args, listening)


def serve_config(args, model_name: str):
    """The server's own settings from the command line, each checked (an InputError names the option)."""
    from kernelbay_engine.serve.app import ServeConfig

    for option, value, least in (
        ("--port", args.port, 0),
        ("--max-num-seqs", args.max_num_seqs, 1),
        ("--max-queued", args.max_queued, 0),
        ("--max-request-bytes", args.max_request_bytes, 1),
    ):
        if value < least:
            raise InputError(f"{option} must be at least {least}, got {value}")
    if args.port > 65535:
        raise InputError(f"--port must be at most 65535, got {args.port}")
    if not args.shutdown_timeout >= 0:
        raise InputError(f"--shutdown-timeout must be a number of seconds >= 0, got {args.shutdown_timeout}")
    return ServeConfig(
        model_name=model_name,
        api_key=args.api_key,
        max_queued=args.max_queued,
        max_request_bytes=args.max_request_bytes,
        shutdown_timeout=args.shutdown_timeout,
    )


def build_serving_llm(args, folder):
    from kernelbay_engine.llm import LLM
    from kernelbay_engine.tokenizer import TokenizerError

    llm = LLM(folder, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len, **engine_options(args))
    if llm.tokenizer is None:
        raise TokenizerError(f"{str(folder)!r} holds no tokenizer; kernelbay serve needs one to read and write text")
    return llm


def run_server(llm, config, args, listening: socket.socket) -> int:
    """Serve on `listening` until SIGTERM or Ctrl-C; 0 once every request has finished or been aborted."""
    import uvicorn

    from kernelbay_engine.serve.app import build_app

    app = build_app(llm, config, max_num_seqs=args.max_num_seqs)
    host, port = listening.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"kernelbay serve: {config.model_name} on http://{shown}:{port}/v1", file=sys.stderr, flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_level="warning", timeout_graceful_shutdown=args.shutdown_timeout, access_log=False, ws="none"
        )
    )
    # uvicorn stops on SIGTERM/SIGINT, then restores these handlers and raises the signal again: they make that
    # a normal exit (0) instead of death by signal.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[listening])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one), or an InputError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise InputError(
            f"cannot listen on {host}:{port} ({err.strerror or err}); choose another --host/--port"
        ) from None
    sock.set_inheritable(True)
    return sock


def _stopped(signum, frame) -> None:
    """The server has already shut down when uvicorn re-raises the signal: nothing left to do."""
