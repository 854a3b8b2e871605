"""A custom module dir that overrides a built-in architecture: `LlamaForCausalLM`, with banned tokens.

    kernelbay run --prompt "Hello" --custom-module-dirs examples/custom_models/llama_override

Registrations from a custom dir are external: this class takes the `LlamaForCausalLM` slot from the
built-in kernelbay-llama (logged once at WARNING; `kernelbay explain` shows origin "custom-dir").
"""

from . import modeling  # noqa: F401 - importing the module registers the override
