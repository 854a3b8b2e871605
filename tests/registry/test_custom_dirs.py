"""Custom module dirs: files by path, folders as packages, external precedence, precise errors."""

from __future__ import annotations

import contextlib
import sys
import textwrap

import pytest

from kernelbay.errors import CustomModuleDirError
from kernelbay.registry import load_custom_module_dirs


@pytest.fixture
def cleanup_modules():
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("my_", "kb_")):
            del sys.modules[name]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_file_registrations_are_custom_dir_and_take_external_slots(make_registry, tmp_path, cleanup_modules):
    """A .py file's registration carries origin custom-dir and its path, and wins over a pip plugin."""
    reg = make_registry(KERNELBAY_PREFER="GoodForCausalLM=my_override")
    f = _write(
        tmp_path / "my_override.py",
        """
        from kernelbay import register_model

        @register_model("GoodForCausalLM", "MyNewForCausalLM")
        class MyGood:
            pass
    """,
    )
    assert load_custom_module_dirs([f]) == ["my_override"]
    slot = reg.slot("model", "MyNewForCausalLM")
    assert slot.winner.provider.origin == "custom-dir" and slot.winner.provider.path == str(f)
    assert reg.resolve("model", "GoodForCausalLM").__name__ == "MyGood"
    assert [r.provider.distribution for r in reg.slot("model", "GoodForCausalLM").displaced] == ["kb-fixture-good"]


def test_directory_is_imported_as_a_package_and_loading_twice_is_a_noop(make_registry, tmp_path, cleanup_modules):
    """A folder with __init__.py is a package (relative imports work); a second load imports nothing."""
    reg = make_registry()
    pkg = tmp_path / "my_models"
    _write(pkg / "__init__.py", "from . import arch\n")
    _write(
        pkg / "arch.py",
        """
        from kernelbay import register_model

        @register_model("MyPkgForCausalLM")
        class MyPkg:
            pass
    """,
    )
    assert load_custom_module_dirs([str(pkg)]) == ["my_models"]
    assert load_custom_module_dirs([str(pkg)]) == []
    assert reg.resolve("model", "MyPkgForCausalLM").__module__ == "my_models.arch"
    assert reg.slot("model", "MyPkgForCausalLM").winner.provider.module == "my_models"


def test_missing_path_is_named(make_registry, tmp_path):
    """A custom dir that does not exist names the path as given and as resolved."""
    make_registry()
    with pytest.raises(CustomModuleDirError, match="custom module dir 'nope/here' does not exist"):
        load_custom_module_dirs(["nope/here"])


def test_import_error_names_file_and_line_and_registers_nothing(make_registry, tmp_path, cleanup_modules):
    """A failing custom module names its file and line; its earlier registrations are dropped."""
    reg = make_registry()
    f = _write(
        tmp_path / "my_broken.py",
        """
        from kernelbay import register_model

        @register_model("HalfForCausalLM")
        class Half:
            pass

        raise RuntimeError("boom")
    """,
    )
    with pytest.raises(CustomModuleDirError) as err:
        load_custom_module_dirs([f])
    assert f"{f}:8" in str(err.value) and "RuntimeError: boom" in str(err.value)
    assert reg.slot("model", "HalfForCausalLM") is None
    assert "my_broken" not in sys.modules


def test_folder_without_init_is_refused_with_the_fix(make_registry, tmp_path):
    """A plain folder (no __init__.py) is an error that says to add one."""
    make_registry()
    (tmp_path / "my_plain").mkdir()
    with pytest.raises(CustomModuleDirError, match=r"has no __init__.py; add one"):
        load_custom_module_dirs([tmp_path / "my_plain"])


def test_name_clash_with_a_loaded_module_is_refused(make_registry, tmp_path):
    """A custom file named like an already-imported module is refused instead of shadowing it."""
    make_registry()
    f = _write(tmp_path / "json.py", "x = 1\n")
    with pytest.raises(CustomModuleDirError, match="would be imported as 'json', but a module of that name"):
        load_custom_module_dirs([f])


@contextlib.contextmanager
def _on_sys_path(folder):
    """`folder` first on sys.path for the block, and only it removed after (monkeypatch.syspath_prepend would
    restore its whole saved sys.path at teardown, after fixture_site removed itself: the fixture plugins would
    then stay importable and discoverable for every later test of the process)."""
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))


def test_a_file_named_like_an_installed_module_is_refused_before_it_shadows_it(
    make_registry, tmp_path, cleanup_modules
):
    """A custom `kb_shadowed.py` while a package `kb_shadowed` is installed (on the path, not imported yet) is
    refused naming the installed one, and nothing is imported under that name."""
    installed = _write(tmp_path / "site" / "kb_shadowed" / "__init__.py", "x = 1\n").parent
    make_registry()
    f = _write(tmp_path / "custom" / "kb_shadowed.py", "x = 2\n")
    with _on_sys_path(tmp_path / "site"), pytest.raises(CustomModuleDirError) as err:
        load_custom_module_dirs([f])
    expected = f"as 'kb_shadowed', which would shadow the installed module 'kb_shadowed' ({installed})"
    assert expected in str(err.value)
    assert "kb_shadowed" not in sys.modules


def test_a_custom_dir_on_sys_path_is_not_a_clash_with_itself(make_registry, tmp_path, cleanup_modules):
    """Run from the folder holding it (`python -m` puts the cwd on sys.path), a custom dir finds only itself."""
    make_registry()
    _write(tmp_path / "my_selfpkg" / "__init__.py", "x = 1\n")
    with _on_sys_path(tmp_path):
        assert load_custom_module_dirs([tmp_path / "my_selfpkg"]) == ["my_selfpkg"]


def test_tqdm_py_in_a_custom_dir_is_refused_on_the_command_line(fixture_site, tmp_path):
    """The reported case: `--custom-module-dirs ./tqdm.py` would break every progress bar; it is one error line."""
    import subprocess

    from .conftest import env_with_site

    f = _write(tmp_path / "tqdm.py", "x = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "kernelbay.cli", "plugins", "--custom-module-dirs", str(f)],
        capture_output=True,
        text=True,
        env=env_with_site(fixture_site),
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "would be imported as 'tqdm', which would shadow the installed module 'tqdm'" in done.stderr
