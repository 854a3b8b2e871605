"""Write core/kernelbay/registry/first_party.json from the entry points of plugins/*/pyproject.toml: the first-party
distributions, and which of them provides each name (the registry names it in "pip install ..." hints, whether it
is installed or not, so the fact is derived here, once, not typed by hand):

    python tools/first_party_table.py           # rewrite the file after a plugin's entry points change
    python tools/first_party_table.py --check   # exit 1 while the file and the pyproject files disagree
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tomllib

from kernelbay.registry._records import ANY_ARCHITECTURE, FIRST_PARTY_TABLE, INDEX_GROUP

REPO = Path(__file__).resolve().parents[1]


def table(repo: Path = REPO) -> dict:
    """{"distributions": [...], "provides": {kind: {name: distribution}}} as the plugins' metadata declares it."""
    # one kind per group: vision encoders and drafts share the models index, whose names are "model" names here
    kinds: dict[str, str] = {}
    for kind, group in INDEX_GROUP.items():
        kinds.setdefault(group, kind)
    distributions: list[str] = []
    provides: dict[str, dict[str, str]] = {kind: {} for kind in kinds.values()}
    for pyproject in sorted(repo.glob("plugins/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        distributions.append(project["name"])
        for group, kind in kinds.items():
            names = set(project.get("entry-points", {}).get(group, {})) - {ANY_ARCHITECTURE}  # the fallback's claim
            provides[kind] |= dict.fromkeys(sorted(names), project["name"])
    return {
        "distributions": sorted(distributions),
        "provides": {kind: dict(sorted(p.items())) for kind, p in provides.items() if p},
    }


def rendered(repo: Path = REPO) -> str:
    return json.dumps(table(repo), indent=1) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    target = Path(FIRST_PARTY_TABLE)
    if args.check:
        if target.read_text() != rendered():
            print(f"{target} is stale: run python tools/first_party_table.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(rendered())
    return 0


if __name__ == "__main__":
    sys.exit(main())
