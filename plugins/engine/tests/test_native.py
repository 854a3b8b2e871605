"""kernelbay_engine.native: the compiled ops give aten's bits (rms_norm: within its rounding); where they cannot run,
aten does, visibly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernelbay_engine import native
from kernelbay_engine.layers.norm import RMSNorm
from tests._dispatch import dispatched


@pytest.fixture(scope="module")
def ops():
    module = native.ops()
    assert module is not None, native.status()  # CI has g++ and ninja: the ops must build there
    return module


@pytest.mark.parametrize("dim", [3, 64, 100, 576, 1536, 4096])
@pytest.mark.parametrize("rows", [1, 3, 8, 33])
def test_rms_norm_is_as_close_to_the_exact_norm_as_atens(ops, dim, rows):
    """The native mean of squares sums in its own order (ops.cpp's mean_square), not aten's: its result is within
    float32 rounding of aten's, and about as close to the float64 norm (within twice aten's error and 4 ulps)."""
    gen = torch.Generator().manual_seed(dim * 100 + rows)
    for scale in (1e-3, 1.0, 30.0):
        x = torch.randn(rows, dim, generator=gen) * scale
        w = torch.randn(dim, generator=gen)
        for eps in (1e-5, 1e-6):
            exact = torch.rms_norm(x.double(), (dim,), w.double(), eps)
            aten, native_out = torch.rms_norm(x, (dim,), w, eps), ops.rms_norm(x, w, eps)
            torch.testing.assert_close(native_out, aten, rtol=4e-7 * dim**0.5, atol=1e-7)
            ulp = exact.abs().max() * 2.0**-24  # float32's unit rounding at the largest output
            tolerance = 2 * (aten.double() - exact).abs().max() + 4 * ulp
            assert (native_out.double() - exact).abs().max() <= tolerance


def test_rms_norm_of_a_row_depends_on_that_row_alone(ops):
    """A token's norm has the same bits alone, in a batch and at any thread count (decode, verify rows, prefill)."""
    x, w = torch.randn(37, 576) * 4, torch.randn(576)
    together = ops.rms_norm(x, w, 1e-5)
    for i in (0, 17, 36):
        assert torch.equal(ops.rms_norm(x[i : i + 1].contiguous(), w, 1e-5), together[i : i + 1])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(ops.rms_norm(x, w, 1e-5), together)
    finally:
        torch.set_num_threads(threads)


def test_rms_norm_in_bf16_is_the_float32_norm_then_the_cast(ops):
    x, w = torch.randn(5, 576) * 3, torch.randn(576)
    out = ops.rms_norm(x, w, 1e-5, True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ops.rms_norm(x, w, 1e-5).to(torch.bfloat16))
    norm = RMSNorm(576, eps=1e-5)
    with torch.inference_mode():
        assert torch.equal(norm(x, torch.bfloat16), ops.rms_norm(x, norm.weight, 1e-5).bfloat16())
    assert torch.equal(norm(x, torch.bfloat16), norm(x).bfloat16())  # aten's path (autograd): the same cast


def test_rms_norm_keeps_leading_dims_and_refuses_what_it_cannot_run(ops):
    x, w = torch.randn(2, 5, 64), torch.randn(64)
    assert torch.equal(ops.rms_norm(x, w, 1e-6), ops.rms_norm(x.reshape(10, 64), w, 1e-6).reshape(2, 5, 64))
    with pytest.raises(RuntimeError, match="float32 only"):
        ops.rms_norm(x.bfloat16(), w, 1e-6)
    with pytest.raises(RuntimeError, match="contiguous tensors only"):
        ops.rms_norm(x.transpose(0, 1), w, 1e-6)
    with pytest.raises(RuntimeError, match="weight has 32 elements, rows have 64"):
        ops.rms_norm(x, w[:32].contiguous(), 1e-6)


def test_the_module_runs_the_native_op_in_inference_and_aten_under_autograd(ops):
    norm = RMSNorm(64, eps=1e-6)
    x = torch.randn(4, 64)
    with torch.inference_mode():
        assert dispatched(norm, x) == ["aten.empty_like.default"]  # the output; the norm is one loop
        out = norm(x)
    tracked = norm(x)  # the weight needs its gradient: aten's composite, which autograd decomposes
    assert tracked.grad_fn is not None and "aten.rsqrt.default" in dispatched(norm, x)
    torch.testing.assert_close(out, tracked.detach(), rtol=2e-6, atol=1e-7)
    assert norm(x.t().contiguous().t()).shape == (4, 64)  # a non-contiguous input takes aten's op


def _run(code: str, timeout: int = 300, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


CHECK = """
    import warnings, torch
    warnings.simplefilter("always")
    from kernelbay_engine import native
    from kernelbay_engine.layers.norm import RMSNorm
    norm, x = RMSNorm(8), torch.randn(2, 8)
    with torch.inference_mode():
        torch.testing.assert_close(norm(x), torch.rms_norm(x, (8,), norm.weight, norm.eps), rtol=2e-6, atol=1e-7)
    print(native.status())
"""


def test_disabled_by_environment():
    done = _run(CHECK, KERNELBAY_NATIVE="0")
    assert done.returncode == 0, done.stderr
    assert "native CPU ops not in use: disabled by KERNELBAY_NATIVE=0" in done.stdout
    assert "NativeUnavailableWarning" not in done.stderr


@pytest.mark.slow
def test_a_failed_build_is_warned_about_and_aten_runs(tmp_path):
    """No working compiler (CXX=false) and an empty extension cache: the build fails, the warning says why."""
    done = _run(CHECK, CXX="false", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "NativeUnavailableWarning: kernelbay-engine could not build its native CPU ops" in done.stderr
    assert "Install a C++ compiler (g++) and ninja, or set KERNELBAY_NATIVE=0" in done.stderr
    assert native.BUILDING in done.stderr  # a build ran (and failed): said, once
    assert "native CPU ops not in use:" in done.stdout


def test_the_cache_entry_is_named_by_the_sources_and_flags(tmp_path):
    """Two checkouts with the same sources share one entry; a changed byte or flag is another entry."""
    copies = []
    for checkout in ("a", "b"):
        (tmp_path / checkout).mkdir()
        copies.append([str(tmp_path / checkout / Path(src).name) for src in native.SOURCES])
        for src, dst in zip(native.SOURCES, copies[-1], strict=True):
            Path(dst).write_bytes(Path(src).read_bytes())
    assert native.extension_name(copies[0]) == native.extension_name(copies[1]) == native.extension_name()
    Path(copies[1][0]).write_bytes(Path(copies[1][0]).read_bytes() + b"\n")
    assert native.extension_name(copies[1]) != native.extension_name(copies[0])
    assert native.extension_name(copies[0], ("-O2",)) != native.extension_name(copies[0])
    assert native.build_directory().name == native.extension_name()


def test_a_slow_load_of_a_cached_build_says_nothing(ops):
    """A busy machine loading the cached build slowly (3 s here) is not told that anything is being built."""
    slow_load = """
    import time, torch.utils.cpp_extension as ext
    real = ext.load
    ext.load = lambda *a, **k: (time.sleep(3), real(*a, **k))[1]
"""
    done = _run(slow_load + CHECK)
    assert done.returncode == 0, done.stderr
    assert "native CPU ops loaded" in done.stdout and native.BUILDING not in done.stderr, done.stderr


def test_a_cached_build_is_imported_without_torchs_build_machinery(ops):
    """A finished build is imported as is: torch.utils.cpp_extension (setuptools, a build file written and ninja
    run for its up-to-date check, ~0.1 s of every start) is not imported."""
    done = _run(CHECK + "    import sys; print('torch.utils.cpp_extension' in sys.modules)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["native", "CPU", "ops", "loaded", f"({ops.__file__})", "False"], done.stdout


@pytest.mark.parametrize("xdg", [None, "elsewhere"])
def test_the_default_build_root_is_torchs(tmp_path, monkeypatch, xdg):
    """Where a cached build is looked for without torch's function is where torch's function says."""
    from torch.utils.cpp_extension import get_default_build_root

    if xdg is None:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / xdg))
    assert native.default_build_root() == get_default_build_root()


@pytest.mark.slow
def test_a_stale_build_lock_is_removed_and_the_ops_built(tmp_path):
    """A lock file left by a build killed midway (`touch .../lock`) is not waited on forever: it is removed,
    the ops are built (said once on stderr, building from the entry's own copy of the sources), and a later
    process loads that build without a notice."""
    folder = tmp_path / native.extension_name()
    folder.mkdir()
    (folder / "lock").touch()
    first = _run(CHECK, timeout=1200, TORCH_EXTENSIONS_DIR=str(tmp_path))  # a build: minutes on a busy machine
    assert first.returncode == 0, first.stderr
    assert "left by a native build that did not finish" in first.stderr and native.BUILDING in first.stderr
    assert f"native CPU ops loaded ({folder}" in first.stdout
    assert str(Path(native.__file__).parent) not in (folder / "build.ninja").read_text()  # no checkout's path
    again = _run(CHECK, TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert not (folder / "lock").exists()


@pytest.mark.parametrize("heads", [1, 4, 12])
@pytest.mark.parametrize("tokens", [1, 5])
@pytest.mark.parametrize("dim", [2, 64, 96])
def test_rope_is_transformers_bit_for_bit(ops, heads, tokens, dim):
    from transformers.models.llama.modeling_llama import rotate_half

    gen = torch.Generator().manual_seed(heads * 1000 + tokens * 10 + dim)
    x = torch.randn(tokens, heads + 3, dim, generator=gen) * 4  # heads of a fused q/k view: a strided slice
    angles = torch.randn(tokens, dim // 2, generator=gen) * 50
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    view = x[:, 1 : heads + 1]
    expected = view * cos[:, None] + rotate_half(view) * sin[:, None]  # transformers' apply_rotary_pos_emb
    assert torch.equal(ops.rope(view, cos, sin), expected)


def test_rope_refuses_what_it_cannot_run(ops):
    x, table = torch.randn(2, 3, 8), torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="float32 only"):
        ops.rope(x.bfloat16(), table, table)
    with pytest.raises(RuntimeError, match=r"x must be \[T, N, D\] with its last dim contiguous"):
        ops.rope(x.transpose(1, 2), table, table)
    with pytest.raises(RuntimeError, match="head size must be even"):
        ops.rope(x[..., :7], table[:, :7].contiguous(), table[:, :7].contiguous())
    with pytest.raises(RuntimeError, match=r"cos and sin must be contiguous \[T, D\] = \[2, 8\]"):
        ops.rope(x, table[:1], table[:1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "shape", [(1, 2 * 1536), (7, 2 * 96), (2, 3, 2 * 8), (5, 2 * 1540), (3, 2 * 47), (40, 2 * 11008)]
)
def test_silu_mul_is_aten_bit_for_bit(ops, dtype, shape):
    """float32 runs aten's AVX-512 silu loop natively (SLEEF's exp over whole 32s, std::exp for a row's tail)."""
    gate_up = (torch.randn(*shape, generator=torch.Generator().manual_seed(shape[-1])) * 4).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(ops.silu_mul(gate_up), torch.nn.functional.silu(gate) * up)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() != "AVX512", reason="aten runs no AVX-512 kernels here")
def test_float32_silu_mul_dispatches_only_its_output(ops):
    """On an AVX-512 CPU the float32 silu runs in the op's own loop: no aten silu, view or copy (bf16 keeps them)."""
    assert dispatched(ops.silu_mul, torch.randn(3, 2 * 96)) == ["aten.empty.memory_format"]
    assert "aten.silu.default" in dispatched(ops.silu_mul, torch.randn(3, 2 * 96).bfloat16())


def test_silu_mul_is_aten_bit_for_bit_where_aten_runs_its_avx2_kernels(ops):
    """Under ATEN_CPU_CAPABILITY=avx2 aten's silu loop steps by 16 and rounds a row's tail otherwise: the op takes
    aten's own silu there (a width of 48 is where the two loops differ)."""
    code = """
        import torch
        from kernelbay_engine import native
        assert torch.backends.cpu.get_cpu_capability() == "AVX2"
        for width in (48, 1540):
            gate_up = torch.randn(40, 2 * width, generator=torch.Generator().manual_seed(width)) * 30
            gate, up = gate_up.chunk(2, dim=-1)
            assert torch.equal(native.ops().silu_mul(gate_up), torch.nn.functional.silu(gate) * up), width
    """
    done = _run(code, ATEN_CPU_CAPABILITY="avx2")
    assert done.returncode == 0, done.stderr


def test_silu_mul_refuses_what_it_cannot_run(ops):
    with pytest.raises(RuntimeError, match="float32 or bfloat16 only"):
        ops.silu_mul(torch.randn(2, 8).half())
    with pytest.raises(RuntimeError, match=r"a contiguous \[\.\.\., 2I\] tensor only"):
        ops.silu_mul(torch.randn(8, 2).t())
    with pytest.raises(RuntimeError, match=r"a contiguous \[\.\.\., 2I\] tensor only"):
        ops.silu_mul(torch.randn(2, 7))


def test_qkv_rope_refuses_what_it_cannot_run(ops):
    qkv, table = torch.randn(2, 4 * 8), torch.randn(2, 8)
    assert [t.shape for t in ops.qkv_rope(qkv, 2, 1, table, table)] == [(2, 2, 8), (2, 1, 8), (2, 1, 8)]
    with pytest.raises(RuntimeError, match="qkv must be float32 or bfloat16"):
        ops.qkv_rope(qkv.half(), 2, 1, table, table)
    with pytest.raises(RuntimeError, match="float32 tables only"):
        ops.qkv_rope(qkv, 2, 1, table.bfloat16(), table.bfloat16())
    with pytest.raises(RuntimeError, match=r"qkv must be a contiguous \[2, \(3 \+ 2 \* 1\) \* 8\]"):
        ops.qkv_rope(qkv, 3, 1, table, table)
    with pytest.raises(RuntimeError, match="head size must be even"):
        ops.qkv_rope(qkv[:, :28].contiguous(), 2, 1, table[:, :7].contiguous(), table[:, :7].contiguous())
