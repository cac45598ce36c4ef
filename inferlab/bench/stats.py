"""Small statistics shared by the benchmarks (one home, so the benchmarks need not import each other)."""
from __future__ import annotations


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between ranks as numpy's default; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
