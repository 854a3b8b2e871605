"""Runs a guide (docs/guides/*.md) the way a reader would, so the docs cannot drift from the code.

Fenced blocks, by info string:
- ```bash                  run with bash (errexit) from the repo root, in a sandbox;
- ```python                run with the venv's python, in the same sandbox;
- ```text output           lines the previous block must print, in order ("..." lines are skipped);
- ```LANG file=PATH        an excerpt: must appear verbatim in PATH (relative to the repo root).

The sandbox is what a reader's shell would be: the venv's bin on PATH, and `pip install` redirected
(PIP_TARGET, no index, no deps, no build isolation) into a fresh site dir on PYTHONPATH.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    attrs: dict
    text: str
    line: int

    @property
    def kind(self) -> str:
        if "file" in self.attrs:
            return "excerpt"
        if self.lang == "text" and "output" in self.attrs:
            return "output"
        return "run" if self.lang in ("bash", "python") else "prose"


def _attrs(info: str) -> dict:
    return dict(item.partition("=")[::2] for item in info.split())


def parse(markdown: str) -> list[Block]:
    return [
        Block(m.group(1), _attrs(m.group(2)), m.group(3), markdown.count("\n", 0, m.start()) + 1)
        for m in FENCE.finditer(markdown)
    ]


def sandbox_env(site: Path, venv_bin: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNELBAY_", "ACME_", "PIP_"))}
    return env | {
        "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONPATH": str(site),
        "PIP_TARGET": str(site),
        "PIP_NO_INDEX": "1",
        "PIP_NO_DEPS": "1",
        "PIP_NO_BUILD_ISOLATION": "0",
        "PIP_QUIET": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def run_block(block: Block, env: dict, cwd: Path) -> str:
    cmd = ["bash", "-eo", "pipefail", "-c", block.text] if block.lang == "bash" else [sys.executable, "-"]
    done = subprocess.run(
        cmd,
        input=None if block.lang == "bash" else block.text,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"block at line {block.line} failed ({done.returncode}):\n{block.text}\n--- output:\n{output}"
    )
    return output


def check_output(expected: Block, output: str) -> None:
    """Every expected line appears in `output`, in order (surrounding spaces ignored)."""
    lines = [line.strip() for line in output.splitlines()]
    at = 0
    for want in (w.strip() for w in expected.text.splitlines()):
        if not want or want == "...":
            continue
        found = next((i for i in range(at, len(lines)) if want in lines[i]), None)
        assert found is not None, f"line {expected.line}: {want!r} not printed (in order) by the block above:\n{output}"
        at = found + 1


def check_excerpt(block: Block, repo: Path) -> None:
    source = (repo / block.attrs["file"]).read_text()
    assert block.text.strip(), f"line {block.line}: empty excerpt of {block.attrs['file']}"
    assert block.text in source, f"line {block.line}: excerpt no longer matches {block.attrs['file']}:\n{block.text}"


def run_guide(path: Path, repo: Path, site: Path) -> list[str]:
    """Run every block of the guide; returns what was done, one entry per block."""
    env, output, done = sandbox_env(site, Path(sys.executable).parent), None, []
    for block in parse(path.read_text()):
        if block.kind == "run":
            output = run_block(block, env, repo)
        elif block.kind == "output":
            assert output is not None, f"line {block.line}: an output block needs a bash/python block before it"
            check_output(block, output)
        elif block.kind == "excerpt":
            check_excerpt(block, repo)
        done.append(block.kind)
    return done
