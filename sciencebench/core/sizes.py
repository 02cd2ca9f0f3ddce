"""Sizes in bytes as operators write and read them: `50G`, `512M`, `1.5 GiB`."""

from __future__ import annotations

import re

_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as `50G`, `512M`, `1.5TiB` or `1000000` (binary units); ValueError otherwise."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (for example 50G, 512M)")
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(size: int) -> str:
    """`size` bytes for people: 1.5 GiB, 12.0 MiB."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
