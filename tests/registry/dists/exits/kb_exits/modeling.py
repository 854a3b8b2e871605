"""A provider that ends the process while it is imported (a stray `sys.exit` in module code)."""

import builtins
import sys

from kernelbay import register_model

builtins.__dict__.setdefault("_kb_fixture_imports", []).append(__name__)


@register_model("ExitingForCausalLM")
class ExitingForCausalLM:
    """Registered before the exit: must not survive it."""


sys.exit(3)
