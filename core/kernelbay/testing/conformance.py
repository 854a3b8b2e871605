"""`check_backend`: every spec a backend claims matches the reference; every spec it refuses is refused honestly."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..attention import AttentionBackend, BackendNotCapable, NoCapableBackend, select_attention_backend
from ..attention._backend import backend_class
from ..attention._capabilities import _Any
from ..platforms import Platform
from .claims import common_geometry_gaps, declarations_hint, refused_declarations
from .report import FAIL, NOT_CLAIMED, PASS, SKIPPED, ConformanceReport, SpecResult, is_installed_as
from .runner import build_layer, make_data, reference_output, run_step
from .specs import BatchSpec, select_specs, tolerance


class _KitPlatform(Platform):
    """A platform listing the backend under test first: automatic selection picks it whenever it claims a spec.

    A platform's name is a class attribute: `BackendUnderTest.platform` makes a subclass per name."""

    device_type = "cpu"

    def __init__(self, backend: str):
        self._backend = backend

    def is_current(self) -> tuple[bool, str]:
        return True, "the conformance kit's platform"

    def backend_priority(self) -> list[str]:
        return [self._backend]


@dataclass(frozen=True)
class BackendUnderTest:
    """One backend class, how the selector knows it, and how the kit builds it."""

    cls: type[AttentionBackend]
    name: str
    installed: bool
    """True when `name` resolves to `cls` in the registry, so refusals can be checked through the selector."""
    options: Mapping | None = None
    device: str = "cpu"

    @classmethod
    def of(cls, backend, options: Mapping | None = None, device: str = "cpu") -> BackendUnderTest:
        """From an installed name (unknown: UnknownNameError listing the known ones) or a backend class."""
        klass = backend_class(backend)
        name = backend if isinstance(backend, str) else (klass.name or klass.__name__)
        klass.parse_options(options)  # an unknown or mistyped option is the caller's error, not every spec's
        return cls(klass, name, is_installed_as(klass, name), options, device)

    def platform(self) -> Platform:
        """The kit's platform, named after one the backend declares (any name when it declares ANY)."""
        platforms = self.cls.platforms
        declared = [] if isinstance(platforms, _Any) else sorted(platforms)
        named = type("_KitPlatform", (_KitPlatform,), {"name": declared[0] if declared else "conformance-kit"})
        return named(self.name)

    def unserved(self) -> str | None:
        """None when the backend claims some spec of the whole kit; else what to declare (it would never be chosen:
        the conservative defaults refuse everything a backend leaves undeclared)."""
        every = [spec.requirements() for spec in select_specs(None)]
        refused = [refused_declarations(self.cls, req) for req in every]
        if any(not names for names in refused):
            return None
        gaps = common_geometry_gaps(self.cls) or list(dict.fromkeys(name for names in refused for name in names))
        return declarations_hint(self.name, gaps)

    def check(self, spec: BatchSpec) -> SpecResult:
        """The verdict on one spec; anything the backend raises is a failure carrying its message."""
        available, reason = self.cls.is_available()
        if not available:
            return SpecResult(spec.name, SKIPPED, f"backend unavailable: {reason}")
        try:
            failures = self.cls.capability_failures(spec.requirements())
            return self._check_refusal(spec, failures) if failures else self._check_claim(spec)
        except Exception as exc:  # noqa: BLE001 - reported, never raised: one bad spec must not hide the others
            return SpecResult(spec.name, FAIL, f"raised {type(exc).__name__}: {exc}")

    def _check_claim(self, spec: BatchSpec) -> SpecResult:
        data = make_data(spec)
        on_device = data.to(self.device)
        layer = build_layer(self.cls, spec, on_device, self.options)
        got = run_step(layer, spec, on_device, device=self.device).cpu()
        assert layer.kv_cache is not None  # run_step attached it
        return compare(spec, got, reference_output(spec, data), layer.kv_cache.dtype)

    def _check_refusal(self, spec: BatchSpec, failures: list[str]) -> SpecResult:
        problems = [p for p in (self._builds_anyway(spec), *self._selected_anyway(spec)) if p]
        refused = "; ".join(failures)
        if problems:
            return SpecResult(spec.name, FAIL, f"refuses ({refused}) yet {'; '.join(problems)}")
        unchecked = "" if self.installed else f" (selector not checked: {self.name} is not installed as this class)"
        return SpecResult(spec.name, NOT_CLAIMED, f"not claimed: {refused}{unchecked}")

    def _builds_anyway(self, spec: BatchSpec) -> str | None:
        """A refused geometry must be a ValueError at construction, never a layer that attends differently."""
        if not self.cls.capability_failures(spec.requirements(), fields=self.cls.GEOMETRY):
            return None
        try:
            build_layer(self.cls, spec, make_data(spec), self.options)
        except ValueError:
            return None
        except Exception as exc:  # noqa: BLE001 - the wrong error is the finding
            return f"building the layer raised {type(exc).__name__} instead of ValueError: {exc}"
        return "a layer with that geometry was built (construction must raise ValueError)"

    def _selected_anyway(self, spec: BatchSpec) -> list[str]:
        """Neither a request by name nor automatic selection (with the backend first in priority) may pick it."""
        if not self.installed:
            return []
        req, platform, problems = spec.requirements(), self.platform(), []
        try:
            select_attention_backend(req, requested=self.name, platform=platform)
            problems.append(f"select_attention_backend(requested={self.name!r}) accepted it")
        except BackendNotCapable:
            pass
        try:
            if select_attention_backend(req, platform=platform).backend_name == self.name:
                problems.append("automatic selection picked it")
        except (NoCapableBackend, BackendNotCapable):
            pass
        return problems


def compare(spec: BatchSpec, got, want, cache_dtype=None) -> SpecResult:
    """PASS when `got` has the reference's shape and its max abs error is within the spec's tolerance."""
    if tuple(got.shape) != tuple(want.shape):
        return SpecResult(spec.name, FAIL, f"output shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    tol = tolerance(spec, cache_dtype)
    allowed = tol * max(1.0, want.abs().max().item())
    err = (got.double() - want).abs().max().item()
    note = " (integer KV cache)" if cache_dtype is not None and not cache_dtype.is_floating_point else ""
    if err <= allowed:
        return SpecResult(spec.name, PASS, f"max err {err:.1e} <= {allowed:.1e}{note}", err, allowed)
    return SpecResult(spec.name, FAIL, f"max err {err:.2e} > {allowed:.1e}{note}", err, allowed)


def check_backend(
    backend, specs: Iterable | None = None, *, options: Mapping | None = None, device: str = "cpu"
) -> ConformanceReport:
    """Run the conformance kit on `backend` (an installed name or an AttentionBackend class; an MoE backend's
    name or class runs the MoE kit, `kernelbay.testing.moe`).

    `specs`: names in ALL_SPECS or BatchSpec records (default: all); `options`: the backend's typed options
    (e.g. `{"compile": False}` for FLEX)."""
    from ..attention import clear_selection_cache

    if _is_moe_backend(backend):
        from .moe import check_moe_backend

        return check_moe_backend(backend, specs)
    subject = BackendUnderTest.of(backend, options, device)
    chosen = select_specs(specs)
    clear_selection_cache()  # selections cached before a runtime registration must not answer for this class
    return ConformanceReport(subject.name, tuple(subject.check(spec) for spec in chosen), subject.unserved())


def _is_moe_backend(backend) -> bool:
    from ..registry import names

    if isinstance(backend, str):
        return backend in names("moe_backend") and backend not in names("attention_backend")
    from ..moe import MoEBackend

    return isinstance(backend, type) and issubclass(backend, MoEBackend)
