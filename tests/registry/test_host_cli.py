"""`kernelbay plugins` is honest about what it did not check (it imports nothing); doctor finds it."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import env_with_site


def _cli(site, *args, **env):
    return subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", *args], capture_output=True, text=True, env=env_with_site(site, **env)
    )


def test_plugins_says_providers_were_not_imported_and_doctor_finds_the_broken_one(fixture_site):
    """A plugin with a syntax error is not passed off as fine: plugins points to doctor, doctor names the error."""
    env = {"KERNELBAY_PLUGINS": "kb-fixture-syntax"}
    text = _cli(fixture_site, "plugins", **env)
    assert "\nBroken plugins: none found (providers not imported; run `kernelbay doctor`" in text.stdout
    assert "Broken plugins:\n" not in text.stdout  # no heading over nothing
    doc = json.loads(_cli(fixture_site, "plugins", "--json", **env).stdout)
    assert doc["broken"] == [] and doc["imports_checked"] is False
    doctor = _cli(fixture_site, "doctor", **env)
    assert doctor.returncode == 1
    assert "kb-fixture-syntax: provider kb_syntax.modeling is broken: syntax error" in doctor.stdout
