"""`kernelbay explain MODEL --quantization int8|int4`: which kernel each linear would run, and why.

Contributed through the core's `register_explain_sections` hook (by kernelbay_engine/explain.py): the
module tree is built on `meta` (nothing is loaded), each distinct linear (its name, shape, bit width and
group) is put to the kernel selector, and every candidate's reason is listed, as for attention backends.
"""

from __future__ import annotations

from kernelbay.errors import ConfigError
from kernelbay_engine.layers.linear import Linear
from kernelbay_engine.quant.kernels import LinearRequirements
from kernelbay_engine.quant.method import quant_mode
from kernelbay_engine.quant.select import select_kernel


def linear_kernels_section(config, options: dict) -> dict | None:
    """None without `--quantization`; else one group per distinct (layer name, shape, width, group size)."""
    mode = options.get("quantization")
    if mode is None:
        return None
    if mode == "gguf":  # LLM(quantization="gguf"): the file's own codes, chosen per tensor type by kernelbay-gguf
        raise ConfigError(
            "explain --quantization gguf cannot list the kernels yet: they follow each tensor's GGUF type, which "
            "kernelbay-gguf does not expose to explain; run the model and read llm.quant_report, or explain "
            "--quantization int8 / int4 for quantization after loading"
        )
    spec = quant_mode(mode)
    groups: dict[tuple, dict] = {}
    for path, layer in _linears(config):
        head = path == "lm_head"
        bits, group = (spec.head_bits, spec.head_group_size) if head else (spec.bits, spec.group_size)
        group = group or layer.in_features
        key = (path.rpartition(".")[2], layer.out_features, layer.in_features, bits, group)
        if key in groups:
            groups[key]["count"] += 1
            continue
        groups[key] = _group(key, layer, config)
    section = {"quantization": spec.name, "groups": list(groups.values())}
    section["lines"] = _lines(section)
    return section


def _linears(config):
    from kernelbay_engine import AutoModelForCausalLM

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


def _lines(section: dict) -> list[str]:
    lines = [f"linears      --quantization {section['quantization']}: CPU kernels per linear"]
    for g in section["groups"]:
        per = "per-channel" if g["group_size"] == g["shape"][1] else f"groups of {g['group_size']}"
        out, inp = g["shape"]
        lines.append(f"  {g['name']:<20} x{g['count']:<3} [{out}, {inp}] {g['bits']}-bit {per} -> {g['kernel']}")
        for c in g["candidates"]:
            lines.append(f"    {'*' if c['chosen'] else ' '} {c['name']:<12} {c['reason']}")
            lines += [f"        - {f}" for f in c["failures"]]
    return lines
