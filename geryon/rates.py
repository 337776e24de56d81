"""Parsing and printing link rates ("100mbit", "1gbit", "2.5Gbps") as integer bits per second."""

import re

from geryon.errors import RateError

_UNITS = {
    "": 1, "bit": 1, "bps": 1,
    "k": 10**3, "kbit": 10**3, "kbps": 10**3,
    "m": 10**6, "mbit": 10**6, "mbps": 10**6,
    "g": 10**9, "gbit": 10**9, "gbps": 10**9,
    "t": 10**12, "tbit": 10**12, "tbps": 10**12,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")


def parse_rate(text: str | int) -> int:
    """Return the rate in bits/s; accepts an int or strings like '100mbit', '1Gbps', '500k'."""
    if isinstance(text, int) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        match = _RATE.fullmatch(str(text).lower())
        if not match or match.group(2) not in _UNITS:
            raise RateError(
                f"unknown rate {text!r}: use a number with a unit such as 100mbit, 1gbit, 500kbit or 2.5gbps")
        value, unit = float(match.group(1)), match.group(2)
    bits = int(round(value * _UNITS[unit]))
    if bits < 8000:
        raise RateError(f"rate {text!r} is below 8 kbit/s; give a positive rate such as 100mbit")
    return bits


def format_rate(bits_per_s: float) -> str:
    """Render bits/s the way tc prints it, e.g. 100Mbit."""
    for unit, scale in (("Gbit", 10**9), ("Mbit", 10**6), ("Kbit", 10**3)):
        if bits_per_s >= scale:
            value = bits_per_s / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.3g}{unit}"
    return f"{bits_per_s:g}bit"
