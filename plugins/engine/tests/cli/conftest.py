"""Model folders for `kernelbay run`: the tiny runnable Llama (../conftest.py) and broken variants of it, one per
bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests._paths import REAL_CONFIGS as CONFIGS
from tests.cli.conftest import run_cli


@pytest.fixture(scope="session")
def bad_folders(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    """name -> a folder with exactly one thing wrong."""
    root = tmp_path_factory.mktemp("bad")
    folders = {
        name: root / name for name in ("no_config", "malformed", "unknown_arch", "no_weights", "partial_weights")
    }
    folders["no_config"].mkdir()
    (folders["no_config"] / "README.md").write_text("not a checkpoint")
    folders["malformed"].mkdir()
    (folders["malformed"] / "config.json").write_text('{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}\n')
    _config_only(tiny_llama, folders["unknown_arch"], architectures=["NopeForCausalLM"])
    _config_only(tiny_llama, folders["no_weights"])
    _partial_weights(tiny_llama, folders["partial_weights"])
    return folders


def _config_only(src: Path, dst: Path, **overrides) -> None:
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    config.update(overrides)
    (dst / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, dst / name)


def _partial_weights(src: Path, dst: Path) -> None:
    """The tiny Llama without its layer-1 MLP down projection."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(src / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="session")
def run_cases(tiny_llama, bad_folders, tmp_path_factory) -> dict[str, list[str]]:
    """name -> `kernelbay run` arguments of one CLI case (each a bad input, or a good run)."""
    tiny, bad = str(tiny_llama), {k: str(v) for k, v in bad_folders.items()}
    return {
        "good": ["run", tiny, "--prompt", "the quick brown", "--max-tokens", "8"],
        "demo": ["run", "--prompt", "A", "--max-tokens", "3"],
        "demo_float16": ["run", "--prompt", "A", "--max-tokens", "3", "--dtype", "float16"],
        "missing_folder": ["run", str(tmp_path_factory.mktemp("empty") / "nope"), "--prompt", "x"],
        "no_config": ["run", bad["no_config"], "--prompt", "x"],
        "malformed": ["run", bad["malformed"], "--prompt", "x"],
        "unknown_arch": ["run", bad["unknown_arch"], "--prompt", "x"],
        "unknown_backend": ["run", tiny, "--prompt", "x", "--backend", "SDPAA"],
        "incapable_backend": ["run", str(CONFIGS / "gemma-2-2b"), "--prompt", "x", "--backend", "SDPA"],
        "no_weights": ["run", bad["no_weights"], "--prompt", "x"],
        "partial_weights": ["run", bad["partial_weights"], "--prompt", "x"],
        "prompt_too_long": ["run", tiny, "--prompt", "the lazy dog " * 80],
        "max_tokens_zero": ["run", "--prompt", "x", "--max-tokens", "0"],
        "max_tokens_negative": ["run", "--prompt", "x", "--max-tokens", "-5"],
        "unknown_backend_option": ["run", tiny, "--prompt", "x", "--backend-option", "SDPA.nope=1"],
        "malformed_backend_option": ["run", tiny, "--prompt", "x", "--backend-option", "SDPA"],
    }


@pytest.fixture(scope="session")
def cli_runs(run_cases) -> dict[str, subprocess.CompletedProcess]:
    """Every case run once as its own `kernelbay` process, one per core (start-up dominates)."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = pool.map(lambda args: run_cli(*args), run_cases.values())
        return dict(zip(run_cases, results, strict=True))
