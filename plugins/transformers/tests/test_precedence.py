"""The fallback's rank: below built-in, so a native or external provider always wins; `model_impl` chooses."""

from __future__ import annotations

import itertools

import pytest

from kernelbay.errors import InputError, UnknownNameError
from kernelbay.registry import Origin, default_registry, resolve_impl
from kernelbay.registry._records import Preferences, Provider, Registration, decide
from kernelbay_transformers.modeling import TransformersForCausalLM

FALLBACK = Provider("kernelbay_transformers.modeling", "kernelbay-transformers", "0.1.0", Origin.FALLBACK)
BUILTIN = Provider("kernelbay_llama.modeling", "kernelbay-llama", "0.1.0", Origin.BUILTIN)
EXTERNAL = Provider("acme.modeling", "acme", "1.0", Origin.EXTERNAL)


def _claim(provider: Provider) -> Registration:
    return Registration("model", "XForCausalLM", f"{provider.module}:X", provider)


@pytest.mark.parametrize(
    ("claimants", "winner"),
    [
        ((FALLBACK,), FALLBACK),
        ((FALLBACK, BUILTIN), BUILTIN),
        ((FALLBACK, EXTERNAL), EXTERNAL),
        ((FALLBACK, BUILTIN, EXTERNAL), EXTERNAL),
    ],
)
def test_a_fallback_claim_wins_only_unopposed(claimants, winner):
    """decide(): whatever the order of the claims, a built-in or external claim beats the fallback's."""
    for order in itertools.permutations(claimants):
        slot = decide("model", "XForCausalLM", [_claim(p) for p in order], Preferences())
        assert slot.winner.provider == winner, order
        assert {r.provider for r in slot.displaced} == set(claimants) - {winner}


def test_the_installed_fallback_is_ranked_fallback():
    """kernelbay-transformers, installed for real, is discovered with origin "fallback" and claims "*"."""
    info = default_registry().discovery().plugins["kernelbay-transformers"]
    assert info.origin == Origin.FALLBACK and info.groups == {"kernelbay.models": ["*"]}
    claim = default_registry().fallback_claim("model")
    assert claim.target == "kernelbay_transformers.modeling:TransformersForCausalLM"


def test_native_provider_wins_and_model_impl_chooses():
    """A natively served architecture resolves to its family; "transformers" forces the fallback; an
    architecture nobody claims goes to the fallback ("auto") or is unknown ("native")."""
    native = resolve_impl("model", "LlamaForCausalLM")
    assert native.__module__ == "kernelbay_llama.modeling"
    assert resolve_impl("model", "LlamaForCausalLM", "native") is native
    assert resolve_impl("model", "LlamaForCausalLM", "transformers") is TransformersForCausalLM
    assert resolve_impl("model", "Olmo2ForCausalLM") is TransformersForCausalLM
    with pytest.raises(UnknownNameError, match="Olmo2ForCausalLM"):
        resolve_impl("model", "Olmo2ForCausalLM", "native")
    with pytest.raises(InputError, match="model_impl must be one of auto, native, transformers"):
        resolve_impl("model", "LlamaForCausalLM", "vllm")


def test_the_fallback_is_no_attribute_of_every_name():
    """`kernelbay.models.X` stays the native registry: an unclaimed name is not silently the catch-all class."""
    import kernelbay.models

    assert not hasattr(kernelbay.models, "Olmo2ForCausalLM")
    assert "*" not in dir(kernelbay.models)
