"""pytest plugin (`pytest11` entry point): `pytest --kernelbay-backend NAME` runs the conformance kit.

One test item per batch spec, under `kernelbay-backend[NAME]`: pass, fail (with the kit's detail), or skip
for a spec the backend does not claim or a backend that is unavailable; and `claims_a_spec`, failing a backend
whose declarations refuse every spec (what to declare in its message). pytest loads this module in every
run, so it imports nothing heavy (no torch) and does nothing unless the option is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import pytest

if TYPE_CHECKING:
    from .conformance import BackendUnderTest

MARKER = "kernelbay_conformance"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("kernelbay")
    group.addoption(
        "--kernelbay-backend",
        action="append",
        default=[],
        metavar="NAME",
        help="run kernelbay's attention-backend conformance kit against NAME (repeatable)",
    )


def pytest_configure(config) -> None:
    if config.getoption("kernelbay_backend"):
        config.addinivalue_line("markers", f"{MARKER}: a kernelbay conformance-kit check (--kernelbay-backend)")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """The session's collection gains one collector per --kernelbay-backend, beside whatever paths it has
    (backends are resolved here, after conftests had their chance to register some)."""
    report = yield
    names = collector.config.getoption("kernelbay_backend")
    if isinstance(collector, pytest.Session) and names and report.passed:
        report.result.extend(BackendCollector.of(collector, name) for name in names)
    return report


class ConformanceFailure(Exception):
    """A spec the backend claims (or refuses) did not check out."""


class BackendCollector(pytest.Collector):
    """The kit's items for one backend; an unknown backend name is a usage error listing the known ones."""

    def __init__(self, *, subject: BackendUnderTest, **kwargs):
        super().__init__(**kwargs)
        self.subject = subject
        """The kit's `BackendUnderTest`."""

    @classmethod
    def of(cls, session: pytest.Session, backend: str) -> BackendCollector:
        from ..errors import KernelbayError
        from .conformance import BackendUnderTest

        try:
            subject = BackendUnderTest.of(backend)
        except KernelbayError as err:
            raise pytest.UsageError(f"--kernelbay-backend {backend}: {err}") from None
        name = f"kernelbay-backend[{backend}]"
        return cls.from_parent(session, name=name, nodeid=name, subject=subject)

    def collect(self) -> list[pytest.Item]:
        from .specs import ALL_SPECS

        items: list[KitItem] = [ClaimsSomething.from_parent(self, name=ClaimsSomething.NAME)]
        items += [SpecItem.from_parent(self, name=name) for name in ALL_SPECS]
        return [item.add_kit_marker() for item in items]


class KitItem(pytest.Item):
    """One check of the kit on the collector's backend."""

    @property
    def subject(self) -> BackendUnderTest:
        """The backend under test, from the collector that made this item (only BackendCollector makes them)."""
        return cast(BackendCollector, self.parent).subject

    def add_kit_marker(self) -> KitItem:
        self.add_marker(MARKER)
        return self

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return f"[{self.subject.name}] {self.name}: {excinfo.value}"
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"kernelbay conformance: {self.subject.name} {self.name}"


class ClaimsSomething(KitItem):
    """The backend claims some spec of the kit: one whose declarations refuse them all is never selected."""

    NAME = "claims_a_spec"

    def runtest(self) -> None:
        unserved = self.subject.unserved()
        if unserved is not None:
            raise ConformanceFailure(unserved)


class SpecItem(KitItem):
    """One batch spec checked on the collector's backend."""

    def runtest(self) -> None:
        from .conformance import FAIL, PASS
        from .specs import ALL_SPECS

        result = self.subject.check(ALL_SPECS[self.name])
        if result.status == FAIL:
            raise ConformanceFailure(result.detail)
        if result.status != PASS:
            pytest.skip(result.detail)
