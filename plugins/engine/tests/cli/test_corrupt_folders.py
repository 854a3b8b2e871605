"""`kernelbay run` on corrupt model folders: one error line and its exit code (9: weights, 1: tokenizer), no
traceback and no completion printed from silently wrong weights (the other corruptions are covered through the API
in ../models/test_weight_corruption.py; each CLI case costs a process start)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.cli.conftest import run_cli

from .test_run import assert_error

SAFE = "model.safetensors"


def _header_one_byte_short(folder: Path) -> None:
    """Rewrite the header with trailing padding, then claim one byte less: it still parses as JSON."""
    data = (folder / SAFE).read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + size] + b" " * 8
    (folder / SAFE).write_bytes(struct.pack("<Q", len(header) - 1) + header + data[8 + size :])


def _duplicate(folder: Path) -> None:
    save_file({"model.norm.weight": torch.full((64,), 7.0)}, folder / "zz-extra.safetensors")


def _nan(folder: Path) -> None:
    state = load_file(folder / SAFE)
    state["model.embed_tokens.weight"][5, 3] = float("nan")
    save_file(state, folder / SAFE)


def _int_weights(folder: Path) -> None:
    state = load_file(folder / SAFE)
    state["model.norm.weight"] = state["model.norm.weight"].to(torch.int32)
    save_file(state, folder / SAFE)


def _tokenizer_json(folder: Path) -> None:
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')


CASES = {
    "header_one_byte_short": (_header_one_byte_short, 9, ["model.safetensors is not a valid safetensors file"]),
    "duplicate": (_duplicate, 9, ["'model.norm.weight' is in both model.safetensors and zz-extra.safetensors"]),
    "nan": (_nan, 9, ["model.embed_tokens.weight", "NaN or infinite"]),
    "int_weights": (_int_weights, 9, ["model.norm.weight is stored as int32 where the model holds float32"]),
    "tokenizer_json": (_tokenizer_json, 1, ["tokenizer", "cannot be loaded", "tokenizer.json"]),
}


@pytest.fixture(scope="module")
def corrupt_runs(tiny_llama, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Each case's folder (the tiny Llama with one corruption) run once, one process per core."""
    root = tmp_path_factory.mktemp("corrupt")
    folders = {}
    for name, (corrupt, _, _) in CASES.items():
        folders[name] = shutil.copytree(tiny_llama, root / name)
        corrupt(folders[name])
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs = pool.map(
            lambda f: run_cli("run", str(f), "--prompt", "the quick", "--max-tokens", "3"), folders.values()
        )
        return dict(zip(folders, runs, strict=True))


@pytest.mark.parametrize("case", CASES)
def test_corrupt_folder_is_one_error_line(case, corrupt_runs):
    """The corruption is named on one `kernelbay run: error:` line with its exit code, and nothing is generated."""
    _, exit_code, fragments = CASES[case]
    result = corrupt_runs[case]
    assert_error(result, exit_code, *fragments)
    assert result.stdout == ""
