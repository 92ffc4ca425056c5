"""FastTTS's dynamic branching (docs/design.md, "FastTTS"): a retained path's share of the N children grows
with how far its score lies above the weakest retained path's.

weights w_i = s_i - min_j s_j over the retained logical copies; children_i = N * w_i / sum(w), rounded by
giving each its floor and the remaining children to the largest fractional parts (ties to the better-ranked
copy), so they add up to N. When every weight is 0 (all scores equal) the children are spread uniformly,
so at N = 4 with four equal parents each gets one. Min-subtraction matters: raw scores 0.9 and 0.7 give
nearly the same share (4 / 4 at N = 8 after rounding), the differences give the whole budget to 0.9.
"""

from __future__ import annotations

from specscale.search.policies import cyclic_children
from specscale.search.tree import Candidate


def dynamic_children(retained: list[tuple[Candidate, int]], slots: int) -> list[int]:
    """Children per retained logical copy (copies in rank order)."""
    scores = [c.score for c, copies in retained for _ in range(copies)]
    floor = min(scores)
    weights = [s - floor for s in scores]
    total = sum(weights)
    if total <= 0:
        return cyclic_children(retained, slots)
    quotas = [slots * w / total for w in weights]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: slots - sum(counts)]:
        counts[i] += 1
    return counts
