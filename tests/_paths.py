"""Paths the tests share. The real published configs are vendored so a fresh clone is self-contained."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# 74 config.json files from real checkpoints, with their quirks; provenance in SOURCES.md there.
REAL_CONFIGS = REPO / "tests" / "data" / "configs"


def shared_config_dirs() -> list[str]:
    """Every folder of the vendored real configs (tests/data/configs) kernelbay must handle."""
    return sorted(p.name for p in REAL_CONFIGS.iterdir() if p.is_dir())


def load_shared(name: str) -> dict:
    return json.loads((REAL_CONFIGS / name / "config.json").read_text())
