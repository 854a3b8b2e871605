
from kernelbay import register_model

import kb_not_installed_dependency  # noqa: F401


@register_model("MissingDepForCausalLM")
class MissingDepForCausalLM:
    pass
