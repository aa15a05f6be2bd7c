"""Parsing of human-friendly byte sizes ("512MB", "4GiB", 1_000_000)."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}


def parse_bytes(value: int | float | str, name: str = "memory_budget") -> int:
    """Return a byte count from an int, a float or a string such as ``"512MB"`` or ``"4 GiB"``.

    Raises
    ------
    ValueError
        If the value is not a positive size; the message names ``name``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a number of bytes or a string like '4GB', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number of bytes, got {value!r}")
        size = int(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must look like '512MB', '4GiB' or a byte count, got {value!r}")
        size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])  # digits only: finite
    else:
        raise TypeError(f"{name} must be a number of bytes or a string like '4GB', got {type(value).__name__}")
    if size <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return size
