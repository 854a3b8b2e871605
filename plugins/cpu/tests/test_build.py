"""kernelbay_cpu.build: any plugin's C++ source is built once, cached under its own name, imported as built; where
it cannot be, the plugin's fallback runs, visibly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernelbay_cpu.build import ENV, NativeLibrary, NativeUnavailableWarning

# one function, no torch headers: a plain CPython extension builds in seconds
SOURCE = """
#include <Python.h>

static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, "42"}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "answer", nullptr, -1, methods};
#define INIT_NAME(name) PyInit_##name
#define INIT(name) INIT_NAME(name)
PyMODINIT_FUNC INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
"""
FALLBACK = "the selector picks another backend"


def _library(source: Path, name: str = "kernelbay_test_answer") -> NativeLibrary:
    return NativeLibrary(name, [source], owner="kernelbay-test", fallback=FALLBACK, cflags=("-O0",), ldflags=())


@pytest.fixture
def source(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(ENV, raising=False)
    path = tmp_path / "answer.cpp"
    path.write_text(SOURCE)
    return path


def _run(source: Path) -> subprocess.CompletedProcess:
    """A fresh process asks for the library's ops (the environment, TORCH_EXTENSIONS_DIR included, is this one's)."""
    code = f"""
        import sys, warnings
        warnings.simplefilter("always")
        from kernelbay_cpu.build import NativeLibrary
        library = NativeLibrary("kernelbay_test_answer", [{str(source)!r}], owner="kernelbay-test",
                                fallback={FALLBACK!r}, cflags=("-O0",), ldflags=())
        print(library.ops().answer(), library.status())
        print("torch.utils.cpp_extension" in sys.modules)
    """
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )


@pytest.mark.slow
def test_a_library_is_built_once_and_then_imported_as_built(source):
    """The first process builds (said on stderr) into TORCH_EXTENSIONS_DIR / extension_name(); the next imports
    that build without torch's build machinery and says nothing."""
    library = _library(source)
    first = _run(source)
    assert first.returncode == 0, first.stderr
    assert library.building in first.stderr
    assert first.stdout.startswith(f"42 native CPU ops loaded ({library.build_directory()}/"), first.stdout
    assert library.build_directory().parent == Path(os.environ["TORCH_EXTENSIONS_DIR"])
    again = _run(source)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert again.stdout.splitlines() == [first.stdout.splitlines()[0], "False"]


def test_each_library_has_its_own_cache_entry(source, tmp_path):
    """Another name, another source byte or other flags: another entry; the same inputs: the same entry."""
    other = tmp_path / "other" / source.name
    other.parent.mkdir()
    other.write_text(SOURCE)
    library = _library(source)
    assert library.extension_name().startswith("kernelbay_test_answer_")
    assert _library(other).extension_name() == library.extension_name()  # a copy elsewhere shares the entry
    assert _library(source, "kernelbay_test_other").extension_name().startswith("kernelbay_test_other_")
    other.write_text(SOURCE + "\n")
    assert _library(other).extension_name() != library.extension_name()
    assert library.extension_name(cflags=("-O2",)) != library.extension_name()
    assert library.building == "kernelbay-test: building its native CPU ops (once per machine and torch version)..."


def test_disabled_by_environment(source, monkeypatch):
    """KERNELBAY_NATIVE=0: nothing is built, ops() is None and status() names the variable."""
    monkeypatch.setenv(ENV, "0")
    library = _library(source)
    assert library.ops() is None
    assert library.status() == "native CPU ops not in use: disabled by KERNELBAY_NATIVE=0"
    assert library.reason() == "disabled by KERNELBAY_NATIVE=0"
    assert not library.build_directory().exists()


def _ask(library: NativeLibrary):
    return library.ops()  # the function asking for the ops; the warning points at its caller


def test_a_failed_build_warns_naming_the_owner_and_the_fallback(source, monkeypatch):
    """No working compiler (CXX=false), an empty cache: the warning names the plugin, why, and what runs instead,
    at the code that asked; ops() stays None without a second build or warning."""
    monkeypatch.setenv("CXX", "false")
    library = _library(source)
    with pytest.warns(NativeUnavailableWarning) as caught:
        assert _ask(library) is None
    message = str(caught[0].message)
    assert message.startswith("kernelbay-test could not build its native CPU ops (")
    assert f"; {FALLBACK}. Install a C++ compiler (g++) and ninja, or set KERNELBAY_NATIVE=0" in message
    assert caught[0].filename == __file__
    assert library.status() == f"native CPU ops not in use: {library.reason()}" and library.reason()
    assert library.ops() is None  # answered once: no second build, no second warning


def test_forced_runs_the_fallback_for_a_block(source, monkeypatch):
    """forced(None, reason) makes ops() None and status() say why for a block; the earlier answer comes back."""
    monkeypatch.setenv(ENV, "0")
    library = _library(source)
    with library.forced(None, "turned off by this test"):
        assert library.ops() is None and library.status() == "native CPU ops not in use: turned off by this test"
        with library.forced(os):
            assert library.ops() is os and library.reason() == ""
        assert library.reason() == "turned off by this test"
    assert library.status() == "native CPU ops not in use: disabled by KERNELBAY_NATIVE=0"
