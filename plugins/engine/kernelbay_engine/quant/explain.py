"""`kernelbay explain MODEL --quantization int8|int4|gguf`: which kernel each linear would run, and why.

The explain document's `linear_kernels` section (kernelbay_engine/explain/sections.py): the
module tree is built on `meta` (nothing is loaded), each distinct linear (its name, shape, bit width and
group) is put to the kernel selector, and every candidate's reason is listed, as for attention backends.
"""

from __future__ import annotations

from kernelbay.errors import ConfigError
from kernelbay_engine.explain.text import candidate_lines
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.quant.kernels import LinearRequirements
from kernelbay_engine.quant.method import quant_mode
from kernelbay_engine.quant.select import select_kernel


def linear_kernels_section(config, options: dict) -> dict | None:
    """None without `--quantization`; else one group per distinct (layer name, shape, width, group size)."""
    mode = options.get("quantization")
    if mode is None:
        return None
    groups: dict[tuple, dict] = {}
    sources: dict[int, str] = {}  # id(group) -> what its weights come from (a file's tensor types)
    kept: dict[tuple[str, str], int] = {}  # (layer name, why) -> count, for layers that keep their loaded weight
    tables: list[str] = []  # a token embedding held as the file's codes (no kernel: rows dequantized per lookup)
    for path, layer, bits, group, source in _planned(config, mode):
        name = path.rpartition(".")[2]
        if bits is None:
            kept[name, source] = kept.get((name, source), 0) + 1
            continue
        if not isinstance(layer, Linear):
            tables.append(_table_line(name, layer, bits, group, source))
            continue
        key = (name, layer.out_features, layer.in_features, bits, group, source)
        if key in groups:
            groups[key]["count"] += 1
            continue
        groups[key] = _group(key[:5], layer, config)
        sources[id(groups[key])] = source
    section = {"quantization": mode, "groups": list(groups.values())}
    section["lines"] = _lines(section, sources, kept) + tables
    return section


def _table_line(name: str, table, bits: int, group: int, source: str) -> str:
    vocab, hidden = table.weight.shape
    return (
        f"  {name:<20} x1   [{vocab}, {hidden}] {bits}-bit groups of {group}, from {source}: held as codes, "
        "rows dequantized to the model dtype per lookup"
    )


def _planned(config, mode: str):
    """(path, layer, bits, group size, source) per linear; bits None: it keeps its loaded weight, `source` says why."""
    from kernelbay_engine.args import FILE_QUANTIZATION

    if mode == FILE_QUANTIZATION:
        yield from _file_planned(config, mode)
        return
    spec = quant_mode(mode)
    for path, layer in _linears(config):
        head = path == "lm_head"
        bits, group = (spec.head_bits, spec.head_group_size) if head else (spec.bits, spec.group_size)
        yield path, layer, bits, group or layer.in_features, ""


def _file_planned(config, mode: str):
    """What a weight file's format makes of each linear (`quantized_forms`, read from the header alone)."""
    from pathlib import Path

    from kernelbay_engine.loading.formats import format_for
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    path = Path(config.source)
    fmt = format_for(path)
    if not hasattr(fmt, "quantized_forms"):
        raise ConfigError(
            f"--quantization {mode} keeps a .gguf file's own quantized weights, but {config.source} "
            f"is not a .gguf file; explain --quantization int8 / int4 for quantization after loading"
        )
    model = AutoModelForCausalLM.from_config(config)  # on meta: geometry only
    layers = dict(model.named_modules())
    for name, form in fmt.quantized_forms(model, path).items():
        if isinstance(form, str):
            yield name, layers[name], None, None, form
        else:
            yield name, layers[name], form.bits, form.group_size, form.source


def _linears(config):
    from kernelbay_engine.models.auto import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)  # on meta: geometry only
    for path, layer in model.named_modules():
        if isinstance(layer, Linear) and not layer.batch_shape:
            yield path, layer


def _group(key: tuple, layer: Linear, config) -> dict:
    from kernelbay_engine.models.base import torch_dtype

    name, out, inp, bits, group = key
    choice = select_kernel(LinearRequirements(bits, group, inp, out, torch_dtype(config.dtype)))
    return {
        "name": name,
        "count": 1,
        "shape": [out, inp],
        "bits": bits,
        "group_size": group,
        "kernel": choice.kernel.name,
        "candidates": [c.to_dict() for c in choice.candidates],
    }


def _lines(section: dict, sources: dict[int, str], kept: dict[tuple[str, str], int]) -> list[str]:
    lines = [f"linears      --quantization {section['quantization']}: CPU kernels per linear"]
    for g in section["groups"]:
        per = "per-channel" if g["group_size"] == g["shape"][1] else f"groups of {g['group_size']}"
        out, inp = g["shape"]
        lines.append(f"  {g['name']:<20} x{g['count']:<3} [{out}, {inp}] {g['bits']}-bit {per} -> {g['kernel']}")
        if sources.get(id(g)):
            lines.append(f"      from {sources[id(g)]}")
        lines += candidate_lines(g["candidates"], 12)
    lines += [f"  {name:<20} x{count:<3} keeps its loaded weight: {why}" for (name, why), count in kept.items()]
    return lines
