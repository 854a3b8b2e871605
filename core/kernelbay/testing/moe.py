"""The kit for MoE backends: a dense reference, named specs and capability-honesty checks.

`check_moe_backend(NAME or class)` runs every spec (also reached through `check_backend` / `kernelbay
check-backend NAME` when NAME is an MoE backend); specs cover the activations, biases, stored formats and the
routing edge cases (tied weights, every token on one expert, experts that receive no token)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .._deprecation import renamed_field
from ..moe import ExpertWeights, MoEBackend, MoEGeometry, MoERequirements, dense_weights, gated_activation
from .report import FAIL, NOT_CLAIMED, PASS, SKIPPED, ConformanceReport, SpecResult, is_installed_as


@dataclass(frozen=True, slots=True)
class MoESpec:
    name: str
    tokens: int
    num_experts: int = 8
    top_k: int = 2
    hidden: int = 32
    intermediate: int = 24
    activation: str = "silu"
    bias: bool = False
    dtype: str = "float32"
    routing: str = "random"  # "random" | "ties" (equal weights) | "one_expert" | "few_experts" (most experts idle)
    expert_format: str = "dense"

    def geometry(self) -> MoEGeometry:
        swiglu = self.activation == "swigluoai"
        return MoEGeometry(
            self.num_experts,
            self.top_k,
            self.hidden,
            self.intermediate,
            self.activation,
            self.bias,
            self.bias,
            alpha=1.702 if swiglu else None,
            limit=7.0 if swiglu else None,
            expert_format=self.expert_format,
            block_size=(16, 16) if self.expert_format == "fp8_block" else None,
        )

    def requirements(self) -> MoERequirements:
        return MoERequirements.from_geometry(self.geometry(), dtype=self.dtype)


renamed_field(MoESpec, "weight_format", "expert_format")


MOE_SPECS = (
    MoESpec("moe_one_token", tokens=1),
    MoESpec("moe_small_batch", tokens=7),
    MoESpec("moe_prefill", tokens=96, num_experts=16, top_k=4),
    MoESpec("moe_top1", tokens=9, top_k=1),
    MoESpec("moe_tied_weights", tokens=12, routing="ties"),
    MoESpec("moe_all_to_one_expert", tokens=10, routing="one_expert"),
    MoESpec("moe_idle_experts", tokens=5, num_experts=32, routing="few_experts"),
    MoESpec("moe_gelu", tokens=8, activation="gelu_pytorch_tanh"),
    MoESpec("moe_swigluoai_bias", tokens=8, activation="swigluoai", bias=True),
    MoESpec("moe_bfloat16", tokens=16, dtype="bfloat16"),
    MoESpec("moe_fp8_block", tokens=8, expert_format="fp8_block"),
    MoESpec("moe_mxfp4", tokens=8, hidden=64, intermediate=64, expert_format="mxfp4"),
)
_TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2, "float16": 5e-3}


def _routing(spec: MoESpec, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    t, e, k = spec.tokens, spec.num_experts, spec.top_k
    if spec.routing == "one_expert":
        ids = torch.stack([torch.full((t,), 3), *(torch.full((t,), j) for j in range(4, 3 + k))], dim=1)
    elif spec.routing == "few_experts":
        ids = torch.stack([torch.randperm(k, generator=gen) for _ in range(t)]) * 5 % e
    else:
        ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(t)])
    weights = torch.rand(t, k, generator=gen) + 0.1
    if spec.routing == "ties":
        weights = torch.full((t, k), 1.0 / k)
    return ids, weights / weights.sum(-1, keepdim=True)


def _weights(spec: MoESpec, gen: torch.Generator) -> ExpertWeights:
    e, h, i = spec.num_experts, spec.hidden, spec.intermediate

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    bias = spec.bias
    gate_up_bias, down_bias = (rand(e, 2 * i), rand(e, h)) if bias else (None, None)
    if spec.expert_format == "fp8_block":
        gate_up, down = rand(e, 2 * i, h).to(torch.float8_e4m3fn), rand(e, h, i).to(torch.float8_e4m3fn)
        scale = (rand(e, -(-2 * i // 16), -(-h // 16)).abs() + 0.5, rand(e, -(-h // 16), -(-i // 16)).abs() + 0.5)
        return ExpertWeights(gate_up, down, gate_up_bias, down_bias, *scale)
    if spec.expert_format == "mxfp4":
        packed = (
            torch.randint(0, 256, (e, 2 * i, h // 32, 16), generator=gen, dtype=torch.uint8),
            torch.randint(0, 256, (e, h, i // 32, 16), generator=gen, dtype=torch.uint8),
        )
        scales = (
            torch.randint(120, 126, (e, 2 * i, h // 32), generator=gen, dtype=torch.uint8),
            torch.randint(120, 126, (e, h, i // 32), generator=gen, dtype=torch.uint8),
        )
        return ExpertWeights(packed[0], packed[1], gate_up_bias, down_bias, scales[0], scales[1])
    return ExpertWeights(rand(e, 2 * i, h), rand(e, h, i), gate_up_bias, down_bias)


def make_moe_data(spec: MoESpec, seed: int = 0):
    """(hidden [T, H], topk_ids [T, k], topk_weights [T, k], ExpertWeights) for one spec, deterministic."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(spec.tokens, spec.hidden, generator=gen)
    ids, weights = _routing(spec, gen)
    return x, ids, weights, _weights(spec, gen)


@torch.no_grad()
def reference_moe(geometry: MoEGeometry, x, topk_ids, topk_weights, weights: ExpertWeights) -> torch.Tensor:
    """The contract's MoE in float64, token by token (kernelbay.moe._geometry's formula): [T, H]."""
    w = dense_weights(geometry, weights, torch.float64)
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = geometry.intermediate_size
    for t in range(x.shape[0]):
        for e, weight in zip(topk_ids[t].tolist(), topk_weights[t].double().tolist(), strict=True):
            gate_up = w.gate_up[e] @ x[t].double()
            if w.gate_up_bias is not None:
                gate_up = gate_up + w.gate_up_bias[e].double()
            y = w.down[e] @ gated_activation(geometry, gate_up[:inter], gate_up[inter:])
            if w.down_bias is not None:
                y = y + w.down_bias[e].double()
            out[t] += weight * y
    return out


def check_moe_spec(cls: type[MoEBackend], spec: MoESpec, name: str, installed: bool) -> SpecResult:
    available, reason = cls.is_available()
    if not available:
        return SpecResult(spec.name, SKIPPED, f"backend unavailable: {reason}")
    try:
        failures = cls.capability_failures(spec.requirements())
        return _refusal(cls, spec, failures, name, installed) if failures else _claim(cls, spec)
    except Exception as exc:  # noqa: BLE001 - reported, never raised
        return SpecResult(spec.name, FAIL, f"raised {type(exc).__name__}: {exc}")


def _claim(cls: type[MoEBackend], spec: MoESpec) -> SpecResult:
    from ..dtypes import torch_dtype

    geometry = spec.geometry()
    x, ids, topk_weights, weights = make_moe_data(spec)
    dtype = torch_dtype(spec.dtype)
    backend = cls(geometry)
    cast = ExpertWeights(
        *(
            t.to(dtype) if t is not None and t.is_floating_point() and t.dtype.itemsize > 1 else t
            for t in (
                weights.gate_up,
                weights.down,
                weights.gate_up_bias,
                weights.down_bias,
                weights.gate_up_scale,
                weights.down_scale,
            )
        )
    )
    got = backend.forward(x.to(dtype), ids, topk_weights, backend.prepare_weights(cast))
    want = reference_moe(geometry, x.to(dtype).float(), ids, topk_weights, cast)
    allowed = _TOLERANCE[spec.dtype] * max(1.0, want.abs().max().item())
    err = (got.double() - want).abs().max().item()
    status = PASS if err <= allowed else FAIL
    return SpecResult(
        spec.name, status, f"max err {err:.1e} {'<=' if status == PASS else '>'} {allowed:.1e}", err, allowed
    )


def _refusal(cls, spec: MoESpec, failures: list[str], name: str, installed: bool) -> SpecResult:
    from ..attention import BackendNotCapable
    from ..moe import select_moe_backend

    problems = []
    if cls.capability_failures(spec.requirements(), fields=cls.GEOMETRY):
        try:
            cls(spec.geometry())
            problems.append("a backend with that geometry was built (construction must raise ValueError)")
        except ValueError:
            pass
    if installed:
        try:
            select_moe_backend(replace(spec.requirements(), platform=None), requested=name)
            problems.append(f"select_moe_backend(requested={name!r}) accepted it")
        except BackendNotCapable:
            pass
    refused = "; ".join(failures)
    if problems:
        return SpecResult(spec.name, FAIL, f"refuses ({refused}) yet {'; '.join(problems)}")
    return SpecResult(spec.name, NOT_CLAIMED, f"not claimed: {refused}")


def check_moe_backend(backend, specs=None) -> ConformanceReport:
    """The MoE kit on `backend` (an installed `kernelbay.moe_backends` name or an MoEBackend class)."""
    from ..attention import clear_selection_cache
    from ..errors import UnknownNameError
    from ..registry import resolve

    cls = resolve("moe_backend", backend) if isinstance(backend, str) else backend  # unknown: the known names
    name = backend if isinstance(backend, str) else (backend.name or backend.__name__)
    installed = is_installed_as(cls, name, "moe_backend")
    by_name = {s.name: s for s in MOE_SPECS}
    unknown = [s for s in specs or () if isinstance(s, str) and s not in by_name]
    if unknown:
        raise UnknownNameError(f"unknown MoE spec(s) {', '.join(unknown)}; specs: {', '.join(by_name)}")
    chosen = [by_name[s] if isinstance(s, str) else s for s in specs] if specs else list(MOE_SPECS)
    clear_selection_cache()
    return ConformanceReport(
        name, tuple(check_moe_spec(cls, spec, name, installed) for spec in chosen), _unserved(cls, name)
    )


def _unserved(cls, name: str) -> str | None:
    """None when the MoE backend claims some spec of the whole kit; else which declarations refuse them all."""
    from .claims import declarations_hint, refused_declarations

    refused = [refused_declarations(cls, spec.requirements()) for spec in MOE_SPECS]
    if any(not names for names in refused):
        return None
    in_every = [n for n in refused[0] if all(n in names for names in refused)]
    return declarations_hint(
        name, in_every, "kernelbay.moe.MoEBackend: dtypes, activations, routings, expert_formats, platforms"
    )
