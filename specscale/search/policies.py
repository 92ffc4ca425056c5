"""Pure decision rules the search composes: aggregation, selection, early-pruning threshold,
children allocation and thinning. No state, no I/O."""

from __future__ import annotations

import math
import random

from specscale.search.tree import Candidate


def aggregate(step_scores: tuple[float, ...], how: str) -> float:
    """A path's score from its step scores: last (default), min, prod or mean."""
    if not step_scores:
        return 0.0
    if how == "last":
        return step_scores[-1]
    if how == "min":
        return min(step_scores)
    if how == "prod":
        return math.prod(step_scores)
    return sum(step_scores) / len(step_scores)


def rank_key(c: Candidate) -> tuple:
    """Best first: higher score, then the canonical tree position (timing-independent)."""
    return (-c.score, c.key)


def top_k_copies(candidates: list[Candidate], k: int) -> list[tuple[Candidate, int]]:
    """The k best logical copies, counting each candidate's multiplicity: [(candidate, copies)]."""
    chosen, left = [], k
    for c in sorted(candidates, key=rank_key):
        if left == 0:
            break
        copies = min(c.multiplicity, left)
        chosen.append((c, copies))
        left -= copies
    return chosen


def strict_threshold(certain: list[Candidate], k: int) -> float | None:
    """tau = the k-th highest score among candidates certain to be in the round's pool (counting
    multiplicity); None until they hold k copies. A candidate strictly below tau can never be
    among the top k, whatever scores arrive later."""
    if sum(c.multiplicity for c in certain) < k:
        return None
    copies = top_k_copies(certain, k)
    return copies[-1][0].score


def cyclic_children(retained: list[tuple[Candidate, int]], slots: int) -> dict[Candidate, int]:
    """Fill `slots` children by cycling over the retained copies in rank order (search-and-learn's
    duplication): with k copies retained each gets slots / k."""
    copies = [c for c, n in retained for _ in range(n)]
    counts = {c: 0 for c, _ in retained}
    for i in range(slots):
        counts[copies[i % len(copies)]] += 1
    return counts


def proportional_children(retained: list[tuple[Candidate, int]], slots: int) -> dict[Candidate, int]:
    """FastTTS: children in proportion to score (floor, then the largest remainders)."""
    weights = [(c, c.score * n) for c, n in retained]
    total = sum(w for _, w in weights)
    if total <= 0:
        return cyclic_children(retained, slots)
    quotas = [(c, slots * w / total) for c, w in weights]
    counts = {c: int(q) for c, q in quotas}
    by_remainder = sorted(quotas, key=lambda cq: (-(cq[1] - int(cq[1])), cq[0].key))
    for c, _ in by_remainder[: slots - sum(counts.values())]:
        counts[c] += 1
    return counts


def kept_copies(rng: random.Random, remaining: int, keep_left: int, piece: int) -> int:
    """How many of a finishing piece's `piece` copies fall in a uniformly random subset of
    `keep_left` out of the `remaining` unfinished copies (one hypergeometric draw)."""
    kept = 0
    for _ in range(piece):
        if rng.random() < keep_left / remaining:
            kept += 1
            keep_left -= 1
        remaining -= 1
    return kept
