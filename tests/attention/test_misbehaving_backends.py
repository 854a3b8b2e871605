"""A backend that answers outside the contract is named in a clear error: never a traceback deep in the model,
never counted as capable, never silently wrong attention."""

from __future__ import annotations

import pytest
import torch

from kernelbay.attention import AttentionForwardArgs, BackendNotCapable, select_attention_backend
from kernelbay.attention._backend import backend_class
from kernelbay.errors import KernelbayError
from kernelbay.registry import register_attention_backend
from kernelbay.testing.runner import run_step

from ._fakes import FakePlatform
from ._harness import SPECS, build_layer, make_data, run_backend
from .test_selector import FULL, by_name

SPEC = SPECS["mixed_prefill_decode"]


def _vanilla_with(name: str, **attrs) -> type:
    """VANILLA with one method replaced by a misbehaving one."""
    return type(name, (backend_class("VANILLA"),), {"name": name, **attrs})


def _attend(self, q, metadata, args):
    return backend_class("VANILLA")._attend(self, q, metadata, args)


BAD_OUTPUTS = {
    "none": lambda self, q, m, a: None,
    "extra_column": lambda self, q, m, a: torch.zeros(*q.shape[:2], q.shape[2] + 1, dtype=q.dtype),
    "one_row": lambda self, q, m, a: _attend(self, q, m, a)[:1],
    "float64": lambda self, q, m, a: _attend(self, q, m, a).double(),
    "flattened": lambda self, q, m, a: _attend(self, q, m, a).reshape(q.shape[0], -1),
}


@pytest.mark.parametrize("bad", sorted(BAD_OUTPUTS))
def test_wrong_attend_output_is_a_contract_error_naming_the_backend(bad):
    """None, a wrong shape or a wrong dtype from _attend: AttentionContractError naming backend, layer and shape."""
    backend = _vanilla_with("BAD_OUT", _attend=BAD_OUTPUTS[bad])
    with pytest.raises(KernelbayError, match=r"attention backend BAD_OUT .* layer 0: _attend must return") as e:
        run_backend(backend, SPEC)
    assert type(
        e.value
    ).__name__ == "AttentionContractError" and "[T, num_heads, v_head_dim] = [12, 4, 64], got " in str(e.value)


def test_a_broadcastable_output_does_not_fill_output_silently():
    """With output= preallocated, a [1, H, D] answer would broadcast over every token: it is refused instead."""
    backend = _vanilla_with("ONE_ROW", _attend=BAD_OUTPUTS["one_row"])
    data = make_data(SPEC)
    layer = build_layer(backend, SPEC, data)
    out = torch.empty(data.queries.shape, dtype=data.queries.dtype)
    original = layer.forward
    layer.forward = lambda q, k, v, md, args=None: original(q, k, v, md, AttentionForwardArgs(output=out))
    with pytest.raises(KernelbayError, match="ONE_ROW"):
        run_step(layer, SPEC, data)


def test_a_well_behaved_backend_passes_the_boundary_check():
    """VANILLA's own output passes unchanged (the check costs a shape and dtype comparison)."""
    assert run_backend("VANILLA", SPEC).shape == (12, SPEC.num_heads, SPEC.head_dim)


BAD_AVAILABILITY = {"a string": "no", "a bare bool": False, "None": None, "a non-bool": ("", "why"), "1-tuple": (True,)}


@pytest.mark.parametrize("answer", sorted(BAD_AVAILABILITY))
def test_is_available_must_answer_bool_and_str(fresh_registry, answer):
    """An is_available() answer that is not (bool, str) is a failure naming the contract; never "available"."""
    got = BAD_AVAILABILITY[answer]
    register_attention_backend("ODD", target=_vanilla_with("ODD", is_available=classmethod(lambda cls: got)))
    result = select_attention_backend(FULL, platform=FakePlatform("ODD", "SDPA"))
    assert result.backend_name == "SDPA"
    (failure,) = by_name(result)["ODD"].failures
    assert failure == f"available: ODD.is_available() must return (bool, str), got {got!r}; fix the backend " + (
        f"({__name__})"
    )
    with pytest.raises(BackendNotCapable, match=r"requested attention backend ODD .*\n.*is_available\(\) must return"):
        select_attention_backend(FULL, requested="ODD", platform=FakePlatform("SDPA"))


def _raise(cls, *args, **kwargs):
    raise RuntimeError("driver exploded")


@pytest.mark.parametrize(
    "method, answer, failure",
    [
        ("is_available", _raise, "capability check of ODD raised RuntimeError: driver exploded"),
        ("capability_failures", _raise, "capability check of ODD raised RuntimeError: driver exploded"),
        ("capability_failures", lambda cls, req, fields=None: None, "ODD.capability_failures() must return a list"),
        ("capability_failures", lambda cls, req, fields=None: "no", "ODD.capability_failures() must return a list"),
    ],
    ids=["is_available raises", "capability_failures raises", "returns None", "returns a str"],
)
def test_capability_answers_that_raise_or_are_junk(fresh_registry, method, answer, failure):
    """A raising or junk capability answer fails that backend only (named), and selection of the others works."""
    register_attention_backend("ODD", target=_vanilla_with("ODD", **{method: classmethod(answer)}))
    result = select_attention_backend(FULL, platform=FakePlatform("ODD", "SDPA"))
    assert result.backend_name == "SDPA"
    (got,) = by_name(result)["ODD"].failures
    assert got.startswith(failure), got
    with pytest.raises(BackendNotCapable, match="requested attention backend ODD"):
        select_attention_backend(FULL, requested="ODD", platform=FakePlatform("SDPA"))
