"""Parse the human forms people write in configs and job reports: ``70B``, ``15T``, ``8.5e9``, ``30s``, ``2h``."""

from __future__ import annotations

import math
import re

_SUFFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtTpP]?)\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ms|s|m|h|d|w)")


def parse_quantity(value: object) -> float:
    """A non-negative count: a number, or a string like ``"70B"``, ``"15T"``, ``"8.5e9"``.

    K/M/B/T are thousand, million, billion, trillion (B and G both mean 1e9). Raises ValueError.
    """
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match:
            raise ValueError(f"cannot read {value!r} as a number")
        number = float(match.group(1)) * _SUFFIXES[match.group(2).lower()]
    else:
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a finite non-negative number")
    return number


def parse_duration(value: object) -> float:
    """Seconds from a number or a Prometheus-style duration such as ``"30s"``, ``"1h30m"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("empty duration")
        parts = _DURATION_PART.findall(text)
        if "".join(n + u for n, u in parts) != text:
            try:
                seconds = float(text)
            except ValueError:
                raise ValueError(f"cannot read {value!r} as a duration") from None
        else:
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    else:
        raise ValueError(f"expected a duration, got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a finite non-negative duration")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form, e.g. ``67.7d`` or ``3h12m``; used in CLI output and the status page."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        hours, rest = divmod(int(seconds), 3600)
        return f"{hours}h{rest // 60:02d}m"
    if seconds >= 60:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m{rest:02d}s"
    return f"{seconds:.1f}s"
