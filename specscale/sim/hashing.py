"""Deterministic hashing for the synthetic models: every draw they make is a function of a prefix and a seed.

Python hashes tuples of ints without per-process randomisation, so `prefix_key` is reproducible run to
run (within one Python version); `mix64` (splitmix64's finaliser) spreads keys into uniform 64-bit values.
"""

from __future__ import annotations

MASK = (1 << 64) - 1


def mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def prefix_key(seed: int, token_ids) -> int:
    """A 64-bit key of (seed, a token prefix)."""
    return mix64((hash(tuple(token_ids)) ^ mix64(seed)) & MASK)


def unit_interval(key: int) -> float:
    """A uniform draw in (0, 1) from a key."""
    return ((mix64(key) >> 11) + 0.5) / (1 << 53)
