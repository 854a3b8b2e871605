"""`kernelbay check-backend NAME`: the kit's command, run against one installed attention or MoE backend."""

from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("name", metavar="NAME", help="an installed attention or MoE backend (see `kernelbay plugins`)")
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="SPEC",
        help="check only this batch spec (repeatable; default: every spec)",
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a typed option of the backend, e.g. compile=false for FLEX (repeatable)",
    )
    parser.add_argument("--device", default="cpu", help="torch device the backend runs on (default: cpu)")
    parser.add_argument("--json", action="store_true", help="machine-readable report")


def run(args) -> int:
    from ..cli import backend_options
    from .conformance import check_backend

    _check_installed(args.name)
    options = backend_options(args.backend_option, args.name).get(args.name)
    report = check_backend(args.name, args.spec or None, options=options, device=args.device)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.render())
    return 0 if report.passed else 1


def _check_installed(name: str) -> None:
    """An unknown NAME is an UnknownBackend (exit 7), listing the installed attention and MoE backends."""
    from ..errors import UnknownBackend, unknown_name_message
    from ..registry import names

    known = {*names("attention_backend"), *names("moe_backend")}
    if name not in known:
        raise UnknownBackend(unknown_name_message("backend", name, known))
