"""The kit's verdicts: one `SpecResult` per spec, a backend's `ConformanceReport`, and whether the registry's
backend of a name is the class under test (attention and MoE kits alike)."""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, NOT_CLAIMED, SKIPPED = "pass", "fail", "not-claimed", "skipped"
_MARKS = {PASS: "PASS", FAIL: "FAIL", NOT_CLAIMED: "----", SKIPPED: "SKIP"}


@dataclass(frozen=True, slots=True)
class SpecResult:
    """One spec's verdict on one backend."""

    spec: str
    status: str
    """"pass", "fail", "not-claimed" (the backend refuses it, honestly) or "skipped" (backend unavailable)."""
    detail: str
    max_error: float | None = None
    tolerance: float | None = None
    """The allowed max error, already scaled by the reference's magnitude."""

    def line(self) -> str:
        return f"{_MARKS[self.status]}  {self.spec:<22} {self.detail}"

    def to_dict(self) -> dict:
        return {
            "spec": self.spec,
            "status": self.status,
            "detail": self.detail,
            "max_error": self.max_error,
            "tolerance": self.tolerance,
        }


@dataclass(frozen=True, slots=True)
class ConformanceReport:
    """Every checked spec of one backend."""

    backend: str
    results: tuple[SpecResult, ...]
    unserved: str | None = None
    """Set when the backend claims none of the kit's specs (it would never be selected): what to declare."""

    @property
    def passed(self) -> bool:
        """No spec failed (refused and skipped specs are not failures), and the backend claims some spec."""
        return self.unserved is None and all(r.status != FAIL for r in self.results)

    def counts(self) -> dict[str, int]:
        return {status: sum(r.status == status for r in self.results) for status in _MARKS}

    def summary(self) -> str:
        c = self.counts()
        verdict = "conforms" if self.passed else "DOES NOT CONFORM"
        if self.unserved is not None:
            verdict = "CLAIMS NO SPEC"
        elif self.passed and c[NOT_CLAIMED] and not c[PASS]:
            verdict = "claims none of these specs"
        return (
            f"{self.backend}: {verdict}: {c[PASS]} passed, {c[FAIL]} failed, {c[NOT_CLAIMED]} not claimed, "
            f"{c[SKIPPED]} skipped"
        )

    def render(self) -> str:
        return "\n".join([*(r.line() for r in self.results), self.summary(), *filter(None, [self.unserved])])

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "passed": self.passed,
            "counts": self.counts(),
            "results": [r.to_dict() for r in self.results],
            "unserved": self.unserved,
        }


def is_installed_as(cls, name: str, kind: str = "attention_backend") -> bool:
    """Whether the registry's backend `name` is this very class (the selector checks need it)."""
    from ..registry import names, resolve

    try:
        return name in names(kind) and resolve(kind, name) is cls
    except Exception:  # noqa: BLE001 - a broken slot is simply not this class
        return False
