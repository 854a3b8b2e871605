"""Every guide in docs/guides runs as written: its commands and code succeed, print what the guide shows,
and its excerpts still match the files they quote."""

from __future__ import annotations

import pytest

from . import _guides
from .conftest import REPO

GUIDES = sorted((REPO / "docs/guides").glob("*.md"))


def test_the_three_guides_exist():
    """The attention-backend, model-family and hardware-platform guides are there to run."""
    assert {g.stem for g in GUIDES} >= {"attention-backend-plugin", "model-family-plugin", "hardware-platform"}


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.stem)
def test_guide_runs_as_written(guide, tmp_path):
    """The guide's bash and python blocks succeed in a fresh sandbox, print its output blocks, and its excerpts
    are verbatim in the repository."""
    done = _guides.run_guide(guide, REPO, tmp_path / "site")
    assert {"run", "output", "excerpt"} <= set(done), f"{guide.name} must run code, show output and quote files"


def test_runner_catches_drift(tmp_path):
    """A stale excerpt or a missing output line fails the guide test (the runner is not a no-op)."""
    guide = tmp_path / "g.md"
    guide.write_text("```python file=contrib/acme/pyproject.toml\nnot in the file\n```\n")
    with pytest.raises(AssertionError, match="excerpt no longer matches"):
        _guides.run_guide(guide, REPO, tmp_path / "site")
    guide.write_text("```bash\necho hello\n```\n\n```text output\ngoodbye\n```\n")
    with pytest.raises(AssertionError, match="'goodbye' not printed"):
        _guides.run_guide(guide, REPO, tmp_path / "site")
