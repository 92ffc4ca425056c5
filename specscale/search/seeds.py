"""Sampling seeds of a search tree's nodes: a real mixer (splitmix64) over the request seed and the node's
tree position, so that no two nodes of one request, nor nodes of two requests with different seeds, share
a stream by construction (docs/design.md, "Seeds").

A node's key is its canonical tree position (`search/tree.py`): the parent's key plus the child index.
The child at index i of a parent samples from `child_seed(request_seed, parent_key, i)`, whether it is its
own engine row or one lane of a deduplicated (CD) row, which is what pairs CD with plain beam search.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
SEED_BITS = 62  # torch's manual_seed takes any int below 2**63; engine keys are drawn below 2**62


def splitmix64(x: int) -> int:
    """One splitmix64 output for state x (a bijection of 64-bit integers with full avalanche)."""
    z = (x + GOLDEN_GAMMA) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def mix(*parts: int) -> int:
    """A 64-bit hash of a sequence of integers: each part (and the count) absorbed through splitmix64."""
    x = splitmix64(len(parts))
    for part in parts:
        x = splitmix64(x ^ (part & MASK64))
    return x


def node_seed(request_seed: int, key: tuple[int, ...]) -> int:
    """Sampling seed of the tree node at `key` (its parent's key plus its child index)."""
    return mix(request_seed, *key) >> (64 - SEED_BITS)


def child_seed(request_seed: int | None, parent_key: tuple[int, ...], index: int) -> int | None:
    """Sampling seed of the child at `index` under tree position `parent_key` (None when unseeded)."""
    if request_seed is None:
        return None
    return node_seed(request_seed, parent_key + (index,))


def seeds_of(request_seed: int | None, keys: tuple[tuple[int, ...], ...]) -> tuple[int, ...] | None:
    """Seeds of the nodes at `keys` (the lanes of one expansion); None when the request is unseeded."""
    if request_seed is None:
        return None
    return tuple(node_seed(request_seed, key) for key in keys)


def child_seeds(request_seed: int | None, parent_key: tuple[int, ...], first: int,
                count: int) -> tuple[int, ...] | None:
    """Seeds of children first .. first + count - 1 of one parent: the lanes of one CD expansion."""
    return seeds_of(request_seed, tuple(parent_key + (first + j,) for j in range(count)))
