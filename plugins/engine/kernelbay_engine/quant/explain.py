"""`kernelbay explain MODEL [--quantization int8|int4|gguf|none]`: which kernel each linear would run, and why (a
GGUF file: its own codes by default).

The explain document's `linear_kernels` section (kernelbay_engine/explain/sections.py): the
module tree is built on `meta` (nothing is loaded), each distinct linear (its name, shape, bit width and
group) is put to the kernel selector, and every candidate's reason is listed, as for attention backends.
"""

from __future__ import annotations

from pathlib import Path

from kernelbay.errors import ConfigError
from kernelbay_engine.args import FILE_QUANTIZATION, NO_QUANTIZATION
from kernelbay_engine.explain.text import candidate_lines
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.quant.kernels import LinearRequirements
from kernelbay_engine.quant.method import DEQUANTIZED, quant_mode
from kernelbay_engine.quant.select import select_kernel


def linear_kernels_section(config, options: dict) -> dict | None:
    """One group per distinct (layer name, shape, width, group size) for what the linears run as `run` would: a
    GGUF file's own codes without `--quantization`, or the mode asked for; a one-line section for a GGUF file's
    codes dequantized (`--quantization none`); None for plain weights."""
    requested = options.get("quantization")
    mode = _run_mode(config, requested)
    if mode is None:
        return _dequantized_section() if requested == NO_QUANTIZATION and _keeps_codes(config) else None
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
    section["lines"] = _lines(section, sources, kept, default=requested is None) + tables + _dense_lines(section)
    return section


def _run_mode(config, requested: str | None) -> str | None:
    """The mode `run` takes for `requested` on this model (None and "none" resolved as LLM resolves them)."""
    from kernelbay_engine.args import quantization_for

    if requested not in (None, NO_QUANTIZATION):
        return requested  # an unknown mode or "gguf" on a folder: refused below with explain's own words
    return quantization_for(requested, Path(config.source))


def _keeps_codes(config) -> bool:
    from kernelbay_engine.loading.formats import format_for

    return hasattr(format_for(Path(config.source)), "keep_quantized")


def _dequantized_section() -> dict:
    line = (
        f"linears      --quantization {NO_QUANTIZATION}: the file's quantized codes are dequantized to dense "
        "weights at load (the default runs them on quantized kernels)"
    )
    return {"quantization": NO_QUANTIZATION, "groups": [], "lines": [line]}


def _dense_lines(section: dict) -> list[str]:
    """A visible line when quantized weights would run dequantized because no quantized kernel can run them here."""
    dense = [g for g in section["groups"] if g["kernel"] == "dense"]
    if not dense or section["quantization"] != FILE_QUANTIZATION:
        return []
    count = sum(g["count"] for g in dense)
    return [f"  note: {count} linears {DEQUANTIZED}"]


def _table_line(name: str, table, bits: int, group: int, source: str) -> str:
    vocab, hidden = table.weight.shape
    return (
        f"  {name:<20} x1   [{vocab}, {hidden}] {bits}-bit groups of {group}, from {source}: held as codes, "
        "rows dequantized to the model dtype per lookup"
    )


def _planned(config, mode: str):
    """(path, layer, bits, group size, source) per linear; bits None: it keeps its loaded weight, `source` says why."""
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


def _lines(section: dict, sources: dict[int, str], kept: dict[tuple[str, str], int], *, default: bool) -> list[str]:
    if default:  # a GGUF file without --quantization: its own codes
        how = f"the file's own codes (default; --quantization {NO_QUANTIZATION} dequantizes them)"
    else:
        how = f"--quantization {section['quantization']}"
    lines = [f"linears      {how}: CPU kernels per linear"]
    for g in section["groups"]:
        per = "per-channel" if g["group_size"] == g["shape"][1] else f"groups of {g['group_size']}"
        out, inp = g["shape"]
        lines.append(f"  {g['name']:<20} x{g['count']:<3} [{out}, {inp}] {g['bits']}-bit {per} -> {g['kernel']}")
        if sources.get(id(g)):
            lines.append(f"      from {sources[id(g)]}")
        lines += candidate_lines(g["candidates"], 12)
    lines += [f"  {name:<20} x{count:<3} keeps its loaded weight: {why}" for (name, why), count in kept.items()]
    return lines
