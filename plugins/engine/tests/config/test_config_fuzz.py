"""Mutated real configs: every one explains to a valid document or fails with a documented, exit-coded error.

A few hundred examples in CI; set KERNELBAY_FUZZ_EXAMPLES=5000 for a longer run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelbay.errors import EXIT_CODES, ConfigError, InputError
from kernelbay_engine.explain import explain_model
from tests._explain_schema import validate
from tests._paths import load_shared, shared_config_dirs

EXAMPLES = int(os.environ.get("KERNELBAY_FUZZ_EXAMPLES", "300"))
CONFIGS = shared_config_dirs()

# What a mutated field's value becomes: the classic troublemakers, each as config.json can spell it.
BAD_VALUES = st.sampled_from(
    [0, -1, 1, float("nan"), float("inf"), -float("inf"), 2**31, 10**9, 2**63, 2**70, 1e308, "", "x", "32", [],
     [1, 2], None, True, {}, {"a": {"b": [1]}}, 0.5, -0.0]
)  # fmt: skip


def _paths(data: dict, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a config, nested objects and first list items included (architectures.0, ...)."""
    out = []
    for key, value in data.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out += _paths(value, (*prefix, key))
        elif isinstance(value, list) and value:
            out.append((*prefix, key, 0))
    return out


def _mutate(data: dict, path: tuple, value) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@st.composite
def mutated_configs(draw):
    """(config name, key path, new value, the mutated config)."""
    name = draw(st.sampled_from(CONFIGS))
    data = load_shared(name)
    path = draw(st.sampled_from(_paths(data)))
    value = draw(BAD_VALUES)
    return name, path, value, _mutate(data, path, value)


def _explain(data: dict):
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(data, allow_nan=True))
        return explain_model(folder)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_mutated_real_config_explains_or_fails_with_a_documented_error(case):
    """Any bad value anywhere in a real config: a schema-valid document or a documented error, nothing else."""
    name, path, value, data = case
    try:
        doc = _explain(data)
    except InputError as err:
        assert type(err).__name__ in EXIT_CODES or err.exit_code in EXIT_CODES.values(), (name, path, value, err)
        return
    except ConfigError:
        return  # exit code 1, as for any kernelbay error
    assert validate(doc) == [], (name, path, value)
