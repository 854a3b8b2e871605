"""The documentation site (mkdocs.yml) builds with warnings as errors: a broken link or anchor, a page missing from
the nav's files, or a docstring mkdocstrings cannot render fails here. The build needs no network."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._paths import REPO

# Every HTTP(S) request the build would make goes to a closed local port and fails.
OFFLINE = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), "http://127.0.0.1:9")

# kernelbay_engine's lazy exports, documented where they are defined (docs/reference/engine.md).
ENGINE_API = (
    "llm.LLM",
    "sampling.SamplingParams",
    "outputs.RequestOutput",
    "outputs.StreamDelta",
    "models.auto.AutoModelForCausalLM",
    "models.base.CausalLM",
)


@pytest.mark.slow
def test_site_builds_strict_offline(tmp_path):
    """`mkdocs build --strict` exits 0 with no network, the API reference holds the engine's public classes, and
    no page links Google Fonts (theme `font: false`)."""
    site = tmp_path / "site"
    env = {**os.environ, **OFFLINE, "NO_PROXY": "", "no_proxy": "", "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr}"
    engine = (site / "reference" / "engine" / "index.html").read_text()
    assert [name for name in ENGINE_API if f'id="kernelbay_engine.{name}"' not in engine] == []
    assert not [p for p in site.rglob("*.html") if "fonts.googleapis.com" in p.read_text()]
