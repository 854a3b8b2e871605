"""Helpers that write variants of a saved checkpoint folder (drop / add / shard / pickle tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def copy_config(src: Path, dst: Path, **changes) -> Path:
    """dst/config.json = src's, with top-level keys changed (None deletes a key)."""
    return copy_json(src, dst, "config.json", changes)


def copy_json(src: Path, dst: Path, name: str, changes: dict) -> Path:
    """dst/name = src/name (a JSON object), with top-level keys changed (None deletes a key)."""
    dst.mkdir(parents=True, exist_ok=True)
    entries = json.loads((src / name).read_text())
    for key, value in changes.items():
        if value is None:
            entries.pop(key, None)
        else:
            entries[key] = value
    (dst / name).write_text(json.dumps(entries))
    return dst


def write_variant(src: Path, dst: Path, state: dict[str, torch.Tensor], **config_changes) -> Path:
    copy_config(src, dst, **config_changes)
    save_file({k: v.contiguous() for k, v in state.items()}, dst / "model.safetensors")
    return dst


def write_sharded(src: Path, dst: Path, num_shards: int = 3) -> Path:
    """The same tensors in `num_shards` files plus model.safetensors.index.json."""
    copy_config(src, dst)
    state = tensors(src)
    names = sorted(state)
    weight_map = {}
    for i in range(num_shards):
        shard = f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        part = names[i::num_shards]
        save_file({n: state[n] for n in part}, dst / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def write_pickle(src: Path, dst: Path) -> Path:
    copy_config(src, dst)
    torch.save(tensors(src), dst / "pytorch_model.bin")
    return dst
