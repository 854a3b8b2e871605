"""pytest plugin (`pytest11` entry point): `pytest --kernelbay-backend NAME` runs the conformance kit."""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kernelbay")
    group.addoption("--kernelbay-backend", action="append", default=[], metavar="NAME",
                    help="run kernelbay's attention-backend conformance kit against NAME (repeatable)")
