"""The text form's small pieces, shared by every explain section: layer ranges, candidate lists, scaled sizes."""

from __future__ import annotations


def compact_layers(layers: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8 (6)"; long lists are cut in the middle."""
    runs, start = [], None
    for i, layer in enumerate(layers):
        start = layer if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            runs.append(f"{start}-{layer}" if layer != start else f"{layer}")
            start = None
    text = ", ".join(runs if len(runs) <= 6 else [*runs[:3], "...", *runs[-2:]])
    return f"{text} ({len(layers)})"


COUNT_UNITS = (("B", 1e9), ("M", 1e6), ("K", 1e3))
BYTE_UNITS = ((" TiB", 2**40), (" GiB", 2**30), (" MiB", 2**20), (" KiB", 2**10))


def scaled(n: int, units: tuple[tuple[str, float], ...], unscaled: str) -> str:
    """`n` in the largest of `units` it reaches, one decimal (21_000_000_000 -> "21.0B"); else `unscaled`."""
    return next((f"{n / size:.1f}{unit}" for unit, size in units if n >= size), unscaled)


def human_bytes(n: int) -> str:
    """1536 -> "1.5 KiB"."""
    return scaled(n, BYTE_UNITS, f"{n} B")


def candidate_lines(candidates: list[dict], width: int) -> list[str]:
    """Each candidate the selector considered ("*" marks the chosen one), its reason, then its failures."""
    lines = []
    for c in candidates:
        lines.append(f"    {'*' if c['chosen'] else ' '} {c['name']:<{width}} {c['reason']}")
        lines += [f"        - {f}" for f in c["failures"]]
    return lines
