"""A provider module that imports a sibling the index names on its own: each is credited its own registrations."""

from __future__ import annotations

import subprocess
import sys

# A fresh process: kernelbay_llama.moe imports kernelbay_llama.modeling (its decoder) while its own import runs.
SCRIPT = """
from kernelbay.registry import default_registry, resolve
resolve("model", "MixtralForCausalLM")
registry = default_registry()
print(registry.slot("model", "MixtralForCausalLM").winner.provider.module)
print(registry.slot("model", "Gemma3ForCausalLM").winner.provider.module)
print(sorted(r.name for r in registry.log() if r.provider.module == "kernelbay_llama.moe"))
"""


def test_a_sibling_imported_during_a_providers_import_keeps_its_own_registrations():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    moe, gemma3, moe_names = done.stdout.splitlines()
    assert moe == "kernelbay_llama.moe"
    assert gemma3 == "kernelbay_llama.modeling"  # not credited to the module whose import pulled it in
    assert "Gemma3ForCausalLM" not in moe_names and "MixtralForCausalLM" in moe_names
