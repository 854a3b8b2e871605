"""transformers, imported for the first time by one thread at a time.

transformers' top-level module is lazy (`transformers.__getattr__` imports a submodule on first access) and that
first access is not thread-safe: four threads reading their first config at once saw `cannot import name
'CONFIG_MAPPING' from 'transformers'`. kernelbay's first use goes through `transformers_names`, which resolves the
names under one lock; once resolved they are plain module attributes, and the lock is no longer taken.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_LOCK = threading.RLock()
_resolved: dict[str, Any] = {}


def transformers_names(*names: str) -> tuple[Any, ...]:
    """The named top-level attributes of `transformers` (`"CONFIG_MAPPING"`, `"AutoConfig"`, ...), each imported
    once under a lock; a name transformers does not have is an AttributeError, as `getattr` gives."""
    if all(name in _resolved for name in names):
        return tuple(_resolved[name] for name in names)
    with _LOCK:
        import transformers

        for name in names:
            if name not in _resolved:
                _resolved[name] = getattr(transformers, name)
    return tuple(_resolved[name] for name in names)


def has_transformers_name(name: str) -> bool:
    """True when `transformers` has this top-level attribute (a model class, say), resolved under the lock."""
    try:
        transformers_names(name)
    except (AttributeError, ImportError):  # not a name of this transformers (or its module fails to import)
        return False
    return True


@functools.cache
def causal_lm_class_names() -> dict[str, str]:
    """transformers' model_type -> causal-LM class name table, imported under the lock."""
    with _LOCK:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


@functools.cache
def model_types_by_class() -> dict[str, frozenset[str]]:
    """Class name -> every model_type transformers' Auto tables pair it with (LlamaForCausalLM: llama, exaone,
    ...): the family an architecture belongs to, from transformers' own tables."""
    with _LOCK:
        from transformers.models.auto import modeling_auto

        tables = [getattr(modeling_auto, name) for name in dir(modeling_auto) if name.endswith("_MAPPING_NAMES")]
    families: dict[str, set[str]] = {}
    for table in tables:
        for model_type, classes in table.items():
            for cls in classes if isinstance(classes, (list, tuple)) else (classes,):
                families.setdefault(cls, set()).add(model_type)
    return {cls: frozenset(types) for cls, types in families.items()}
