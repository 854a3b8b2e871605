"""Bad options, config values and KERNELBAY_* variables: one `error:` line with the documented exit code (or a
named warning for a variable read before any command runs), never a traceback, never silently wrong."""

from __future__ import annotations

import json

import pytest

from .conftest import REPO, run_cli
from .test_explain import explain_in_process

DEMO = REPO / "plugins" / "engine" / "kernelbay_engine" / "demo"


@pytest.fixture
def demo_config(tmp_path):
    """`demo_config(text=None, **changes)`: a folder holding the demo config.json, changed."""

    def make(text: str | None = None, **changes):
        data = {**json.loads((DEMO / "config.json").read_text()), **changes}
        (tmp_path / "config.json").write_text(text if text is not None else json.dumps(data))
        return str(tmp_path)

    return make


def _one_error_line(err: str, command: str = "explain") -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[transformers]")]
    assert "Traceback" not in err and lines and lines[0].startswith(f"kernelbay {command}: error:"), err
    return lines[0]


@pytest.mark.parametrize("value", ["garbage", "int4", ""])
def test_unknown_kv_dtype_is_one_line_listing_the_choices(demo_config, value):
    """explain --kv-dtype garbage: exit 1 naming the option and the dtypes (was a ValueError traceback)."""
    code, _, err = explain_in_process(demo_config(), "--kv-dtype", value)
    line = _one_error_line(err)
    assert code == 1 and "--kv-dtype" in line and "fp8_e4m3" in line


@pytest.mark.parametrize("value", ["0", "=-5MiB", "2XB", "nan", "inf", "1e30"])
def test_bad_memory_is_one_line_naming_the_option(demo_config, value):
    """explain --memory 0 / -5MiB / 2XB / nan / inf / 1e30 (GiB): exit 1 naming --memory and the value as written."""
    args = ["--memory" + value] if value.startswith("=") else ["--memory", value]
    code, _, err = explain_in_process(demo_config(), *args)
    line = _one_error_line(err)
    assert code == 1 and "--memory" in line and "GiBGiB" not in line
    if value in ("nan", "inf"):
        assert f"'{value}'" in line  # as the user typed it, not 'nanGiB'


@pytest.mark.parametrize(
    "changes, code, field",
    [
        (dict(num_hidden_layers=0), 1, "num_hidden_layers"),
        (dict(num_hidden_layers=10**9), 1, "num_hidden_layers"),
        (dict(vocab_size=2**64), 5, "64 bits"),
        (dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": "x"}), 1, "factor"),
    ],
)
def test_bad_config_values_exit_with_the_documented_code(demo_config, changes, code, field):
    """Config values explain used to crash on (or run out of memory for) are one line: 1 ConfigError, 5 malformed."""
    got, _, err = explain_in_process(demo_config(**changes))
    assert got == code and field in _one_error_line(err)


def test_nan_in_config_is_malformed_naming_the_key(demo_config):
    """ "rms_norm_eps": NaN is not JSON: exit 5 naming rms_norm_eps (it used to be accepted silently)."""
    text = json.dumps(json.loads((DEMO / "config.json").read_text()))[:-1] + ', "rms_norm_eps": NaN}'
    code, _, err = explain_in_process(demo_config(text=text))
    assert code == 5 and "rms_norm_eps" in _one_error_line(err)


def test_malformed_prefer_is_a_warning_and_a_doctor_finding_not_a_crash(demo_config):
    """KERNELBAY_PREFER=garbage: commands run, a warning names the entry and form, doctor lists it."""
    explain = run_cli("explain", demo_config(), env={"KERNELBAY_PREFER": "garbage"})
    assert explain.returncode == 0 and "Traceback" not in explain.stderr
    assert "KERNELBAY_PREFER entry 'garbage' is not of the form Name=distribution" in explain.stderr
    doctor = run_cli("doctor", "--json", env={"KERNELBAY_PREFER": "garbage"})
    assert "Traceback" not in doctor.stderr
    assert any("KERNELBAY_PREFER entry 'garbage'" in f for f in json.loads(doctor.stdout)["findings"])


def test_plugin_allow_list_of_only_commas_is_treated_as_unset_and_said_so(demo_config):
    """KERNELBAY_PLUGINS=',,,' names nothing: treated as unset (the demo resolves), with a warning."""
    result = run_cli("explain", demo_config(), env={"KERNELBAY_PLUGINS": ",,,"})
    assert result.returncode == 0, result.stderr
    assert "KERNELBAY_PLUGINS=',,,' names no distribution; treated as unset" in result.stderr


@pytest.mark.parametrize("value, traced", [("false", False), ("off", False), ("0", False), ("yes", True)])
def test_trace_variable_is_parsed_as_a_boolean(value, traced):
    """KERNELBAY_TRACE=false/off/0 keep tracing off (false used to turn it on); yes turns it on."""
    result = run_cli("plugins", env={"KERNELBAY_TRACE": value})
    assert result.returncode == 0 and ("[kernelbay] " in result.stderr) == traced, result.stderr[:300]


def test_trace_variable_that_is_not_a_boolean_is_named_and_off():
    """KERNELBAY_TRACE=maybe: a warning naming the variable and the accepted words; tracing stays off."""
    result = run_cli("plugins", env={"KERNELBAY_TRACE": "maybe"})
    assert result.returncode == 0 and "[kernelbay] " not in result.stderr
    assert "KERNELBAY_TRACE='maybe' is not a boolean" in result.stderr and "1/true/yes/on" in result.stderr


def test_backend_option_items_are_parsed_in_one_place():
    """`--backend-option` items (run's NAME.KEY=VALUE, check-backend's KEY=VALUE for its one backend) go through
    one parser; a malformed item is an InputError showing the form to write."""
    from kernelbay.cli import backend_options
    from kernelbay.errors import InputError

    assert backend_options(["FLEX.compile=false", "SDPA.x=1"]) == {"FLEX": {"compile": "false"}, "SDPA": {"x": "1"}}
    assert backend_options(["compile=false", "FLEX.x=1"], "FLEX") == {"FLEX": {"compile": "false", "x": "1"}}
    with pytest.raises(InputError, match=r"'SDPA' is not of the form NAME\.KEY=VALUE \(e\.g\. FLEX\.compile=false\)"):
        backend_options(["SDPA"])
    with pytest.raises(InputError, match=r"'FLEX\.=1' is not of the form KEY=VALUE \(e\.g\. compile=false\)"):
        backend_options(["FLEX.=1"], "FLEX")
