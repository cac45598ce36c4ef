"""Numbers formatted for people: three significant digits and a unit prefix.

    count(7.0795e9)            '7.08B'        parameters, tokens, requests
    si(3.35e12, "B/s")         '3.35 TB/s'    bytes, FLOP/s, bandwidth (powers of 1000)
    number(1498.53)            '1,499'        a plain quantity: 3 significant digits, thousands separated

Every notebook prints through these, so a slider that lands on 10**0.85 reads "7.08B parameters",
not "7.07946B", and the same quantity looks the same in a header, a title and a table.
"""
from __future__ import annotations

import math

_COUNT = [(1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")]
_SI = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]


def number(x: float, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits: 23.93 -> '23.9', 1498.5 -> '1,499', 0.5 -> '0.5'."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    rounded = round(x, decimals)
    if decimals and round(abs(rounded), decimals) >= 10 ** (digits - 1 - decimals + 1):
        decimals -= 1  # 9.996 -> '10.0' would show a 4th digit: '10'
    text = f"{rounded:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(x: float, table, digits: int) -> tuple[str, str]:
    for scale, prefix in table:
        if abs(x) >= scale * (1 - 0.5 * 10 ** (1 - digits)):  # 999.6e6 rounds to '1B', not '1,000M'
            return number(x / scale, digits), prefix
    return number(x, digits), ""


def count(x: float, digits: int = 3) -> str:
    """A count with K/M/B/T: 7.0795e9 -> '7.08B', 70e9 -> '70B', 5.57e6 -> '5.57M', 512 -> '512'."""
    value, prefix = _scaled(x, _COUNT, digits)
    return value + prefix


def si(x: float, unit: str, digits: int = 3) -> str:
    """A measurement with an SI prefix: si(1.4e11, 'B') -> '140 GB', si(9.89e14, 'FLOP/s') -> '989 TFLOP/s'."""
    value, prefix = _scaled(x, _SI, digits)
    return f"{value} {prefix}{unit}"


def percent(x: float, digits: int = 3) -> str:
    """A ratio as a percentage: 0.697 -> '69.7%', 1.189 -> '119%'."""
    return number(100 * x, digits) + "%"
