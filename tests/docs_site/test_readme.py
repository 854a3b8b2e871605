"""README.md states only facts that stay true: no test count or suite duration that rots as the suite grows or
the machine changes (it says how to count them instead)."""

from __future__ import annotations

import re

from tests._paths import REPO

README = (REPO / "README.md").read_text()


def test_readme_states_no_test_count_or_suite_duration():
    """No "about N tests" / "N minutes" for the suite; the command that counts the tests is given instead."""
    text = " ".join(README.split())
    assert not re.search(r"\b(about|~|over|some)\s*[\d,.]+\s+(tests|minutes)\b", text), "a number that rots"
    assert "pytest --collect-only -q | tail -1" in text
