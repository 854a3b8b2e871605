"""Paths the tests share. The real published configs are vendored so a fresh clone is self-contained."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# 74 config.json files from real checkpoints, with their quirks; provenance in SOURCES.md there.
REAL_CONFIGS = REPO / "tests" / "data" / "configs"
