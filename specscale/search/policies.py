"""Pure decision rules the search composes: aggregation, selection, early-pruning threshold,
children allocation. No state, no I/O."""

from __future__ import annotations

import math

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


def top_k_copies(candidates: list[Candidate], k: int, one_copy_each: bool = False) -> list[tuple[Candidate, int]]:
    """The k best logical copies, each candidate standing for `multiplicity` of them: [(candidate, copies)]
    in the rank of their best copy. Copies are ranked one by one, by score then their own tree position,
    so a CD candidate's copies rank exactly where plain search ranks the separate candidates they stand for
    (a candidate keeps its lowest-keyed copies). one_copy_each: a candidate counts as one copy."""
    copies = sorted((-c.score, key, i) for i, c in enumerate(candidates)
                    for key in (c.lane_keys[:1] if one_copy_each else c.lane_keys))[:k]
    chosen: dict[int, int] = {}
    for _, _, i in copies:
        chosen[i] = chosen.get(i, 0) + 1
    return [(candidates[i], n) for i, n in chosen.items()]


def strict_threshold(certain: list[Candidate], k: int, one_copy_each: bool = False) -> float | None:
    """tau = the k-th highest score among candidates certain to be in the round's pool (counting
    multiplicity); None until they hold k copies. A candidate strictly below tau can never be
    among the top k, whatever scores arrive later."""
    if sum(1 if one_copy_each else c.multiplicity for c in certain) < k:
        return None
    copies = top_k_copies(certain, k, one_copy_each)
    return copies[-1][0].score


def cyclic_children(retained: list[tuple[Candidate, int]], slots: int) -> list[int]:
    """Children per retained logical copy (copies in rank order): fill `slots` by cycling over them
    (search-and-learn's duplication); with k copies retained each gets slots / k."""
    copies = sum(n for _, n in retained)
    return [slots // copies + (i < slots % copies) for i in range(copies)]


def distinct_paths(candidates: list[Candidate]) -> list[Candidate]:
    """One candidate per distinct path text, the lowest-keyed (search-and-learn's filter_duplicates)."""
    first: dict[tuple[str, ...], Candidate] = {}
    for c in sorted(candidates, key=lambda c: c.key):
        first.setdefault(tuple(c.steps()), c)
    return list(first.values())
