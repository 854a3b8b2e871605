"""Subcommands from the `kernelbay.commands` entry-point group: listed from metadata, imported only when run, and
a broken one fails only itself. The plugins are real distributions installed with pip --target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests._install import install_into

GOOD = {
    "pyproject.toml": """
        [build-system]
        requires = ["hatchling>=1.20"]
        build-backend = "hatchling.build"

        [project]
        name = "kb-fixture-commands"
        version = "1.0"
        dependencies = ["kernelbay>=0.1,<0.2"]

        [project.entry-points."kernelbay.commands"]
        hello = "kb_commands.cli:add_hello"
        broken = "kb_commands.broken:add_broken"

        [tool.hatch.build.targets.wheel]
        packages = ["kb_commands"]
    """,
    "kb_commands/__init__.py": "",
    "kb_commands/cli.py": """
        def add_hello(parser):
            parser.add_argument("--name", default="world")
            return lambda args: print(f"hello {args.name}") or 0
    """,
    "kb_commands/broken.py": """
        import kb_commands_missing_dependency  # noqa: F401

        def add_broken(parser):
            return lambda args: 0
    """,
}


PROBE = """
import json, sys
from kernelbay.cli import main
try:
    code = main(ARGS)
except SystemExit as exit:
    code = exit.code
print(json.dumps(sorted(m for m in sys.modules if m.startswith("kb_commands"))))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    source, target = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("site")
    for name, text in GOOD.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip())
    return install_into(target, source)


def _python(site: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAY_")} | {"PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def _main(site: Path, *args: str) -> subprocess.CompletedProcess:
    """`kernelbay ARGS`, then the plugin modules that were imported (a JSON list on the last line)."""
    code = PROBE.replace("ARGS", repr(list(args)))
    return _python(site, code)


def test_help_lists_plugin_commands_without_importing_them(site):
    """`kernelbay --help` names each installed plugin command and its distribution from metadata alone."""
    done = _main(site, "--help")
    assert done.returncode == 0, done.stderr
    assert "hello" in done.stdout and "broken" in done.stdout and "(from kb-fixture-commands 1.0)" in done.stdout
    assert "run" in done.stdout  # kernelbay-engine's, through the same door
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_a_plugin_command_runs_and_imports_only_its_module(site):
    """Running `hello` imports its own module (not the broken sibling) and parses its own arguments."""
    done = _main(site, "hello", "--name", "kernelbay")
    assert done.returncode == 0, done.stderr
    assert "hello kernelbay" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1]) == ["kb_commands", "kb_commands.cli"]


def test_a_broken_plugin_command_fails_only_itself_naming_the_cause(site):
    """A command whose module cannot import is a one-line error naming the distribution and the missing package;
    the core's commands still work beside it."""
    done = _main(site, "broken")
    assert done.returncode == 1
    assert done.stderr.startswith("kernelbay broken: error: ")
    assert "kb-fixture-commands 1.0" in done.stderr and "kb_commands_missing_dependency" in done.stderr
    assert "Traceback" not in done.stderr
    assert _main(site, "plugins", "--json").returncode == 0


def _command_dist(folder: Path, name: str, command: str, module: str) -> None:
    """A metadata-only distribution `name` 1.0 declaring `command = module:add` in `folder`."""
    info = folder / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[kernelbay.commands]\n{command} = {module}:add\n")


def test_a_plugin_cannot_take_a_core_command(tmp_path, site):
    """A plugin declaring `doctor` is ignored with a line on stderr; the core's doctor still answers."""
    _command_dist(tmp_path, "kb-shadow", "doctor", "kb_shadow")
    done = _main(Path(f"{tmp_path}{os.pathsep}{site}"), "doctor", "--help")
    assert done.returncode == 0
    assert "kb-shadow 1.0 declares the command 'doctor', which is the core's own" in done.stderr
    assert "usage: kernelbay doctor" in done.stdout


def test_an_external_command_displaces_the_engines_visibly(tmp_path, site):
    """An external plugin's `explain` takes the command from kernelbay-engine, with a line naming both."""
    (tmp_path / "kb_explain.py").write_text("def add(parser):\n    return lambda args: print('ours') or 0\n")
    _command_dist(tmp_path, "kb-explain", "explain", "kb_explain")
    done = _main(Path(f"{tmp_path}{os.pathsep}{site}"), "explain")
    assert done.returncode == 0 and done.stdout.startswith("ours"), done.stdout + done.stderr
    assert "the command 'explain' of kb-explain 1.0 (external) displaces kernelbay-engine" in done.stderr


def test_two_external_commands_of_one_name_conflict(tmp_path, site):
    """Two external plugins declaring `explain`: running it is an error naming both, never a silent last-wins."""
    _command_dist(tmp_path, "kb-one", "explain", "kb_one")
    _command_dist(tmp_path, "kb-two", "explain", "kb_two")
    done = _main(Path(f"{tmp_path}{os.pathsep}{site}"), "explain")
    assert done.returncode == 1 and "declared by kb-one 1.0 and kb-two 1.0" in done.stderr, done.stderr
    assert _main(Path(f"{tmp_path}{os.pathsep}{site}"), "plugins").returncode == 0  # only that command fails
