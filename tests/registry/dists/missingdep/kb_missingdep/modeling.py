# isort: skip_file
from kernelbay import register_model

import kb_not_installed_dependency  # noqa: F401 - fails after a working import, at line 4 (the test checks it)


@register_model("MissingDepForCausalLM")
class MissingDepForCausalLM:
    pass
