"""`kernelbay` command line: the core's plugins, doctor and check-backend, plus every subcommand an installed
plugin adds through the `kernelbay.commands` entry-point group (`run`, `explain` from kernelbay-engine).

A plugin command is `name = "module:function"`; `function(parser)` adds its arguments to the command's
parser and returns its handler, `handler(args) -> exit code`. The host gives every command `--trace` and
`--custom-module-dirs` (loaded before the handler runs). `kernelbay --help` lists installed commands from
metadata alone; a command's module is imported only when that command runs."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

from .._version import __version__

if TYPE_CHECKING:  # argparse is imported when parsing: the time before main() catches Ctrl-C stays short
    import argparse

# the core's subcommands -> module defining `add_arguments(parser)` and `run(args) -> int`; imported when used.
COMMANDS = {
    "plugins": ("kernelbay.cli._plugins", "installed plugins, slots with provenance, broken plugins, the log"),
    "doctor": ("kernelbay.cli._doctor", "check that every plugin registers what it advertises"),
    "check-backend": ("kernelbay.cli._check_backend", "run the conformance kit against one attention backend"),
}
# The runtime's commands and the distribution that provides them: named when it is not installed or not in use.
RUNTIME_COMMANDS = dict.fromkeys(("run", "explain", "serve"), "kernelbay-engine")
# What each does, for `kernelbay --help`, which imports no plugin (the commands' own parsers say the same).
COMMAND_SUMMARIES = {
    "run": "generate text from a model folder or .gguf file (default: the embedded demo)",
    "explain": "config -> architecture -> provider -> per-layer backend, with reasons",
    "serve": "serve a model over the OpenAI-compatible HTTP API",
}


def plugin_commands() -> dict:
    """Installed plugin subcommands by name (entry-point records; nothing imported). A command is a slot too:
    an external plugin's displaces a first-party one (said on stderr), two external ones are a conflict that
    fails only that command unless KERNELBAY_PREFER picks one; none may take a core command."""
    from kernelbay.registry import default_registry

    claims: dict[str, list] = {}
    for entry in default_registry().discovery().in_group("kernelbay.commands"):
        if entry.name in COMMANDS:
            print(
                f"kernelbay: {entry.distribution} {entry.version} declares the command {entry.name!r}, "
                f"which is the core's own; the plugin's is ignored",
                file=sys.stderr,
            )
            continue
        claims.setdefault(entry.name, []).append(entry)
    return {name: _command_winner(name, entries) for name, entries in claims.items()}


def _command_winner(name: str, entries: list):
    """The entry serving command `name`, by the precedence rule of every slot (`kernelbay.registry.decide`)."""
    from kernelbay.registry import Preferences, Registration, decide, default_registry

    claims = [Registration("command", name, entry, entry.provider) for entry in entries]
    prefer = default_registry().export_providers()["prefer"] if len(claims) > 1 else {}
    slot = decide("command", name, claims, Preferences(prefer))
    if slot.conflict:
        return CommandConflict(name, tuple(reg.target for reg in slot.conflict))
    winner = slot.winner.target
    if slot.displaced:
        displaced = ", ".join(f"{r.target.distribution} {r.target.version}" for r in slot.displaced)
        print(
            f"kernelbay: the command {name!r} of {winner.distribution} {winner.version} ({winner.origin}) "
            f"displaces {displaced}",
            file=sys.stderr,
        )
    return winner


class CommandConflict:
    """Distributions that nothing ranks apart declare one command: running it is an error naming them."""

    def __init__(self, name: str, entries: tuple):
        self.name, self.entries = name, entries
        self.distribution = " and ".join(e.distribution for e in entries)
        self.version = "(conflict)"

    def error(self):
        from kernelbay.errors import RegistrationConflict

        who = " and ".join(f"{e.distribution} {e.version}" for e in self.entries)
        return RegistrationConflict(
            f"the command {self.name!r} is declared by {who}; choose one with KERNELBAY_PREFER="
            f'"{self.name}=<distribution>", uninstall one, or leave one out with '
            f"KERNELBAY_DISABLE_PLUGINS=<distribution>"
        )


def _parser(plugins: dict) -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(prog="kernelbay", description="kernelbay: plugin platform for LLM inference")
    parser.add_argument("--version", action="version", version=f"kernelbay {__version__}")
    parser.add_argument("--trace", action="store_true", help="log discovery, imports, registrations, decisions")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    for name, entry in sorted(plugins.items()):
        sub.add_parser(name, help=_summary(name, f"from {entry.distribution} {entry.version}"), add_help=False)
    for name in RUNTIME_COMMANDS:
        if name not in plugins:
            dist, why, _fix = _unavailable(name)
            sub.add_parser(name, help=_summary(name, f"needs {dist}: {why}"), add_help=False)
    return parser


def _summary(name: str, source: str) -> str:
    summary = COMMAND_SUMMARIES.get(name)
    return f"{summary} ({source})" if summary else f"({source})"


def _unavailable(name: str) -> tuple[str, str, str]:
    """(distribution, why, how to fix) for a runtime command no plugin in use provides: its distribution is
    installed but refused (left out by KERNELBAY_PLUGINS, disabled, a core version it does not support), or
    not installed."""
    from kernelbay.registry import default_registry
    from kernelbay.registry._records import normalize_dist

    dist = RUNTIME_COMMANDS[name]
    info = default_registry().discovery().plugins.get(normalize_dist(dist))
    if info is None or not info.refused:
        return dist, "not installed", f"pip install {dist}"
    if "KERNELBAY_PLUGINS" in info.refused:
        return dist, "left out by KERNELBAY_PLUGINS", f"add {dist} to KERNELBAY_PLUGINS (or unset it)"
    if "KERNELBAY_DISABLE_PLUGINS" in info.refused:
        return dist, "disabled by KERNELBAY_DISABLE_PLUGINS", f"remove {dist} from KERNELBAY_DISABLE_PLUGINS"
    return dist, f"installed but refused: {info.refused}", f"install a {dist} that supports this kernelbay"


def _command(name: str, plugins: dict, parser: argparse.ArgumentParser):
    """Add `name`'s arguments to `parser`; return its `run(args) -> int`."""
    if name in COMMANDS:
        module = importlib.import_module(COMMANDS[name][0])
        module.add_arguments(parser)
        return module.run
    if name not in plugins:
        from kernelbay.errors import InputError

        dist, why, fix = _unavailable(name)
        raise InputError(f"`kernelbay {name}` comes from {dist}, which is {why}: {fix}")
    if isinstance(plugins[name], CommandConflict):
        raise plugins[name].error()
    from kernelbay.registry._imports import load_attribute

    add_command = load_attribute(plugins[name].value, plugins[name].provider)  # a broken plugin fails only its own
    return add_command(parser)


def backend_options(items: list[str], backend: str | None = None) -> dict[str, dict[str, str]]:
    """`--backend-option` items by backend: `["FLEX.compile=false"]` -> `{"FLEX": {"compile": "false"}}` (each
    backend's Options types the values); with `backend` (check-backend's one), `KEY=VALUE` is that backend's."""
    from kernelbay.errors import InputError

    form = "KEY=VALUE (e.g. compile=false)" if backend else "NAME.KEY=VALUE (e.g. FLEX.compile=false)"
    options: dict[str, dict[str, str]] = {}
    for item in items:
        name_key, sep, value = item.partition("=")
        name, dot, key = name_key.partition(".")
        if backend is not None and name != backend:  # check-backend's KEY=VALUE
            name, dot, key = backend, ".", name_key
        if not (sep and dot and name and key):
            raise InputError(f"--backend-option {item!r} is not of the form {form}")
        options.setdefault(name, {})[key] = value
    return options


EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what `yes | head -1` reports for `yes`


INTERRUPTED = "kernelbay: interrupted"
_interrupts: list[int] = []  # SIGINTs the program received (see _remember_interrupts)


def main(argv: list[str] | None = None) -> int:
    """The host: Ctrl-C anywhere (imports, loading, allocation, streaming, after the output) says it was
    interrupted and exits 130, and a closed pipe exits quietly. As the program (`argv` None), SIGINT is
    remembered too, so that C code swallowing the KeyboardInterrupt (torch importing numpy) cannot lose it."""
    program = False
    try:
        program = argv is None and _remember_interrupts()
        code = _main(argv)
        if _interrupts:  # a KeyboardInterrupt swallowed on the way, but Ctrl-C was pressed
            raise KeyboardInterrupt
        _done(program)
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not in the interpreter's exit flush
    except KeyboardInterrupt:
        code = _interrupted(program)
    except BrokenPipeError:
        _done(program)
        _silence_stdout()
        code = EXIT_BROKEN_PIPE
    except Exception:
        if not _interrupts:
            raise
        code = _interrupted(program)  # what a swallowed KeyboardInterrupt left half-imported failed
    if program:
        _exit_code.append(code)
    return code


def _interrupted(program: bool) -> int:
    _done(program)
    print(INTERRUPTED, file=sys.stderr)
    _clear_unhandled_interrupt_flag()
    return EXIT_INTERRUPTED


def _remember_interrupts() -> bool:
    """As the program, where SIGINT is Python's to handle (the main thread, SIGINT not ignored as in a background
    job): record each SIGINT before raising KeyboardInterrupt, and end the process once the exit hooks ran."""
    import atexit
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return False

    def remember(signum, frame):
        _interrupts.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, remember)
    atexit.register(_end_process)  # registered first: runs after every exit hook the command registers
    return True


_exit_code: list[int] = []  # the program's exit code, once main() has one


def _done(program: bool) -> None:
    """The command is done (its output written, or its interruption handled). What is left is the interpreter's
    shutdown: exit hooks, then ~0.7 s of module teardown during which Python has given SIGINT back to the
    system (a Ctrl-C there kills the process by the signal, without a word). So from here Ctrl-C says
    "interrupted" and exits 130 at once, and `_end_process` skips the teardown (which only frees memory)."""
    if not program:
        return
    import os
    import signal

    def leave(signum, frame):
        os.write(2, f"{INTERRUPTED}\n".encode())
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, leave)


def _end_process() -> None:
    """The last exit hook: flush and end with main()'s code (nothing to do when an error escaped main())."""
    import os

    if not _exit_code:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be written
            pass
    os._exit(_exit_code[0])


def _clear_unhandled_interrupt_flag() -> None:
    """A Ctrl-C that lands while C code runs Python through PyRun_String (pybind11's `py::exec`, e.g. during
    torch's import) sets CPython's "unhandled KeyboardInterrupt" flag although we handled it, and `python -m`
    then kills itself with SIGINT after finalizing (exit -2, not 130). Every PyRun_* call starts by clearing it."""
    try:
        import ctypes

        ctypes.pythonapi.PyRun_SimpleString(b"")
    except (ImportError, AttributeError, OSError):  # not CPython: there is no such flag
        pass


def _silence_stdout() -> None:
    """The Python docs' SIGPIPE recipe: point stdout at devnull so the exit flush cannot raise again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout file descriptor (embedded, replaced stream)
        pass


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import argparse

    from kernelbay.errors import KernelbayError

    command = None
    try:
        plugins = plugin_commands()  # discovery: an error in the environment is one line, like any other
        top, rest = _parser(plugins).parse_known_args(argv)
        if top.command is None:
            _parser(plugins).print_help()
            return 2
        command = top.command
        parser = argparse.ArgumentParser(prog=f"kernelbay {command}", description=COMMANDS.get(command, ("", None))[1])
        # `--trace` before or after the command name
        parser.add_argument("--trace", action="store_true", default=top.trace, help=argparse.SUPPRESS)
        parser.add_argument(  # every command's, loaded here so that no command can ignore it
            "--custom-module-dirs",
            nargs="+",
            default=[],
            metavar="PATH",
            help="import these .py files / package folders first; their registrations are external",
        )
        handler = _command(command, plugins, parser)
        args = parser.parse_args(rest)
        if args.trace:
            from kernelbay._trace import enable_trace

            enable_trace()
        if args.custom_module_dirs:
            from kernelbay.registry import load_custom_module_dirs

            load_custom_module_dirs(args.custom_module_dirs)
        return handler(args)
    except KernelbayError as err:
        if _interrupts:  # e.g. a config reader reporting the import a swallowed KeyboardInterrupt broke
            raise KeyboardInterrupt from err
        _traceback_when_tracing(err)
        print(f"kernelbay{' ' + command if command else ''}: error: {err}", file=sys.stderr)
        return getattr(err, "exit_code", 1)


def _traceback_when_tracing(err: BaseException) -> None:
    """Under --trace (KERNELBAY_TRACE=1) an error's traceback, its cause's included, precedes its one line."""
    from kernelbay._trace import _tracing

    if _tracing():
        import traceback

        traceback.print_exception(err, file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
