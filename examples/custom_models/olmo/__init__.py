"""A custom module dir that adds a new architecture: OLMo (`OlmoForCausalLM`, e.g. allenai/OLMo-1B-hf).

    kernelbay run  path/to/olmo-checkpoint --prompt "Hello" --custom-module-dirs examples/custom_models/olmo
    kernelbay explain path/to/olmo-checkpoint --custom-module-dirs examples/custom_models/olmo

The folder is imported as a package named after it (`olmo`); importing it runs `@register_model`,
and the registration's provenance is "custom-dir" (external: it would also override a built-in).
"""

from . import modeling  # noqa: F401 - importing the module registers OlmoForCausalLM
