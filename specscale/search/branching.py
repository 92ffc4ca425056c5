"""FastTTS's dynamic branching (docs/design.md, "FastTTS"): a retained path's share of the N children grows
with how far its score lies above the weakest retained path's.

weights w_i = s_i - min_j s_j + 1e-6 over the retained logical copies; children_i = N * w_i / sum(w),
rounded by giving each its floor and the remaining children to the largest fractional parts, so they add up
to N. As in FastTTS's code (its `search/dynamic_branching.py`): the 1e-6 keeps every weight positive, so
equal scores spread the children uniformly (at N = 4 with four equal parents each gets one), and when as
many copies are retained as there are children (M = 1) each simply gets one. FastTTS breaks equal
fractional parts by a shuffled list order; ours gives them to the better-ranked copy (deterministic, one of
the orders FastTTS can draw). Min-subtraction matters: raw scores 0.9 and 0.7 give nearly the same share
(4 / 4 at N = 8 after rounding), the differences give the whole budget to 0.9.

Which score s_i is (`SearchConfig.branching_score`): "decided", the score the round was decided on, or
"lookahead", FastTTS's: the aggregate of every step score its PRM call returned for the path, which holds
the LookAhead step's when that step ended at the step separator and was scored with the round
(docs/design.md, "Dynamic branching").
"""

from __future__ import annotations

from collections.abc import Callable

from specscale.search.tree import Candidate, CandidateState

WEIGHT_EPSILON = 1e-6  # FastTTS's: the weakest retained copy keeps a tiny positive weight


def decided_score(c: Candidate) -> float:
    """The score c's round was decided on."""
    return c.score


def lookahead_score(c: Candidate) -> float:
    """c's path with its LookAhead step: the score of c's continuation when that step ended at the step
    separator (did not complete the path) and was scored by the time c's round is decided (with round
    verification: in the round's PRM call, the only time it can be); else c's own score."""
    ahead = (a for e in c.children if e.started_as_lookahead and not e.cancelled for a in e.finished
             if a.state == CandidateState.SCORED and not a.completed)
    return next((a.score for a in ahead), c.score)


BRANCHING_SCORES: dict[str, Callable[[Candidate], float]] = {"decided": decided_score, "lookahead": lookahead_score}


def dynamic_children(retained: list[tuple[Candidate, int]], slots: int,
                     score_of: Callable[[Candidate], float] = decided_score) -> list[int]:
    """Children per retained logical copy (copies in rank order), weighing score_of(candidate)."""
    scores = [score_of(c) for c, copies in retained for _ in range(copies)]
    if len(scores) == slots:  # FastTTS does not reallocate then: one child each
        return [1] * slots
    floor = min(scores)
    weights = [s - floor + WEIGHT_EPSILON for s in scores]
    total = sum(weights)
    quotas = [slots * w / total for w in weights]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: slots - sum(counts)]:
        counts[i] += 1
    return counts
