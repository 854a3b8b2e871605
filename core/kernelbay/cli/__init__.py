"""`kernelbay` command line: plugins, doctor, explain, run."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module defining `add_arguments(parser)` and `run(args) -> int`; imported only when used.
COMMANDS = {
    "plugins": ("kernelbay.cli._plugins", "installed plugins, slots with provenance, broken plugins, the log"),
    "doctor": ("kernelbay.cli._doctor", "check that every plugin registers what it advertises"),
    "explain": ("kernelbay.cli._explain", "config -> architecture -> provider -> per-layer backend, with reasons"),
    "run": ("kernelbay.cli._run", "generate text with a model folder (default: the embedded demo)"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelbay", description="kernelbay: plugin platform for LLM inference")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--trace", action="store_true", help="log discovery, imports, registrations, decisions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _version() -> str:
    from .._version import __version__

    return f"kernelbay {__version__}"


def add_custom_dirs_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--custom-module-dirs", nargs="+", default=[], metavar="PATH",
                        help="import these .py files / package folders first; their registrations are external")


def load_custom_dirs(args) -> None:
    if getattr(args, "custom_module_dirs", None):
        from ..registry import load_custom_module_dirs

        load_custom_module_dirs(args.custom_module_dirs)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top, rest = _parser().parse_known_args(argv)
    if top.trace:
        from .._trace import enable_trace

        enable_trace()
    if top.command is None:
        _parser().print_help()
        return 2
    module = importlib.import_module(COMMANDS[top.command][0])
    parser = argparse.ArgumentParser(prog=f"kernelbay {top.command}", description=COMMANDS[top.command][1])
    parser.add_argument("--trace", action="store_true", help=argparse.SUPPRESS)
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    if args.trace and not top.trace:
        from .._trace import enable_trace

        enable_trace()
    from ..errors import KernelbayError

    try:
        return module.run(args)
    except KernelbayError as err:
        print(f"kernelbay {top.command}: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)


if __name__ == "__main__":
    sys.exit(main())
