"""How many vendored real configs `kernelbay explain` serves, by which distribution, and why the rest are refused.

    .venv/bin/python benchmarks/served.py [tests/data/configs]

Measures issue #11's "served/total"; `KERNELBAY_DISABLE_PLUGINS=kernelbay-transformers` counts native families only.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path

from kernelbay.cli import main


def explain(folder: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["explain", str(folder), "--json"])
    return code, out.getvalue(), err.getvalue()


def sweep(root: Path) -> None:
    served: Counter[str] = Counter()
    refused: dict[str, str] = {}
    for folder in sorted(p for p in root.iterdir() if (p / "config.json").is_file()):
        code, out, err = explain(folder)
        if code == 0:
            provider = json.loads(out)["provider"]
            served[f"{provider['distribution']} ({provider['origin']})"] += 1
        else:
            refused[folder.name] = err.strip().removeprefix("kernelbay explain: error: ")[:150]
    print(f"served {sum(served.values())} / {sum(served.values()) + len(refused)}")
    for dist, n in served.most_common():
        print(f"  {n:3d}  {dist}")
    for name, why in refused.items():
        print(f"  refused {name}: {why}")


if __name__ == "__main__":
    sweep(Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/configs"))
