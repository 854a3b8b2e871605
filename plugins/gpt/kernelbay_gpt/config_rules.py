"""What GPT-family configs leave implicit, as kernelbay-gpt's `register_model_type_rules` hook.

Each rule reads a `kernelbay.config.ConfigView` and returns its answer, or None to leave the point to the
core's generic fields. Light to import (no torch, no transformers): hook modules load at the first config.
"""

from __future__ import annotations

from kernelbay.hooks import hookimpl


@hookimpl
def register_model_type_rules(register):
    register(("gpt2", "gpt_bigcode", "falcon", "RefinedWebModel"), intermediate_size=four_times_hidden)
    register(("falcon", "RefinedWeb", "RefinedWebModel"), architecture=falcon_legacy_architecture)
    register("bloom", position_embedding=lambda config: "alibi")
    register(("gpt2", "gpt_bigcode", "opt", "gpt_neox", "falcon", "RefinedWebModel", "bloom"), gated_ffn=not_gated)


def not_gated(config) -> bool:
    """Their MLP is up -> activation -> down: two matrices, not Llama's three (parameter counts read it)."""
    return False


def four_times_hidden(config) -> int:
    """GPT-2, GPT-BigCode, Falcon: the FFN is 4 x hidden where config.json leaves its width null (as documented)."""
    return config.get_int("intermediate_size", "ffn_hidden_size", "n_inner") or 4 * config.hidden_size


def falcon_legacy_architecture(config) -> str | None:
    """Falcon checkpoints published before transformers integrated the family name their class RWForCausalLM."""
    if (config.get("architectures") or ("",))[0] != "RWForCausalLM":
        return None
    config.note("legacy architecture RWForCausalLM resolves as FalconForCausalLM")
    return "FalconForCausalLM"
