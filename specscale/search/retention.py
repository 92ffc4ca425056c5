"""Retention policies: which logical copies of a decided round's running candidates beam selection keeps
(docs/design.md, "KV-aware retention"; issue 46, point 3).

`SearchConfig.retention` names one; each class registers under its name in `RETENTION` (`search/registry.py`).
`BeamSelection` (`search/selection.py`) asks it for the k = N / M copies a round retains (`retain`), and strict
early pruning (`search/pruning.py`) asks it for the lowest score a copy may have and still be retained, given
the k-th best score (`lowest_kept`), so that EP never cancels a candidate the retention might keep.

- score: the k best copies by score, ties to the lower tree position (`policies.top_k_copies`): search-and-learn's
  beam search, and every preset before "kv";
- kv: after ETS (Hooper et al. 2025, "Efficient Tree Search": keep the tree nodes that trade PRM score against
  KV cost and coverage). The best copy, and every copy scoring more than `retention_margin` above the k-th
  best, is kept as by score; the slots left go, one at a time, to the copies within the margin of the k-th
  best (either side): first a copy whose path has written an answer (its last ``\\boxed{}``) that no kept path
  holds (coverage), then the one whose path adds the fewest tokens of KV to what the kept paths hold already
  (a further copy of a kept candidate adds none: CD's lanes of one row; a sibling of a kept path adds its own
  step; a path that left the kept ones r steps up adds those r steps), then the higher score, then the lower
  tree position. Copies more than the margin below the k-th best are never kept (with k = 1 nothing below the
  best is, and "kv" is "score").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.registry import Registry
from specscale.search.tree import Candidate, Key

RETENTION: Registry[ScoreRetention] = Registry("retention")
BOXED = "boxed{"

Copy = tuple[Candidate, Key]  # one logical copy: its candidate and its own tree position


@RETENTION.register("score")
class ScoreRetention:
    """The k best copies by score, ties to the lower tree position."""

    def __init__(self, config: SearchConfig):
        self.config = config

    def retain(self, eligible: list[Candidate], k: int, one_copy_each: bool) -> list[tuple[Candidate, int]]:
        """The copies a round keeps: [(candidate, copies)] in the rank of their best copy."""
        return policies.top_k_copies(eligible, k, one_copy_each=one_copy_each)

    def lowest_kept(self, kth_best: float) -> float:
        """The lowest score a copy may have and be retained, when k certain copies score kth_best or more."""
        return kth_best


@RETENTION.register("kv")
class KVRetention(ScoreRetention):
    """Within `retention_margin` of the k-th best score: coverage of answers, then the least KV added."""

    def retain(self, eligible: list[Candidate], k: int, one_copy_each: bool) -> list[tuple[Candidate, int]]:
        ranked = ranked_copies(eligible, one_copy_each)
        if len(ranked) <= k:
            return super().retain(eligible, k, one_copy_each)
        margin, kth = self.config.retention_margin, score_of(ranked[k - 1])
        kept = KeptPaths()
        for i, copy in enumerate(ranked):
            if i == 0 or score_of(copy) > kth + margin:
                kept.add(copy)
        band = [copy for copy in ranked[len(kept.copies):] if score_of(copy) >= kth - margin]
        while len(kept.copies) < k:
            best = min(band, key=kept.preference)
            band.remove(best)
            kept.add(best)
        return grouped(sorted(kept.copies, key=rank))

    def lowest_kept(self, kth_best: float) -> float:
        """With k = 1 the one copy kept is the best: nothing below it is ever kept."""
        return kth_best if self.config.num_retained == 1 else kth_best - self.config.retention_margin


@dataclass
class KeptPaths:
    """The copies kept so far, the candidates their paths hold KV for, and the answers they have written."""

    copies: list[Copy] = field(default_factory=list)
    held: set[int] = field(default_factory=set)  # ids of every candidate on a kept path
    answers: set[str] = field(default_factory=set)

    def add(self, copy: Copy) -> None:
        self.copies.append(copy)
        node: Candidate | None = copy[0]
        while node is not None and node.id not in self.held:
            self.held.add(node.id)
            node = node.parent
        answer = written_answer(copy[0])
        if answer is not None:
            self.answers.add(answer)

    def added_tokens(self, c: Candidate) -> int:
        """Tokens of KV c's path holds that no kept path holds: its steps below the deepest kept node."""
        total = 0
        node: Candidate | None = c
        while node is not None and node.id not in self.held:
            total += node.num_tokens
            node = node.parent
        return total

    def preference(self, copy: Copy) -> tuple:
        """Smaller is kept first: a new answer, then the least KV added, the higher score, the lower position."""
        c, key = copy
        answer = written_answer(c)
        new_answer = answer is not None and answer not in self.answers
        return (not new_answer, self.added_tokens(c), -score_of(copy), key)


def ranked_copies(candidates: list[Candidate], one_copy_each: bool) -> list[Copy]:
    """Every logical copy (one per candidate with one_copy_each), by score then tree position."""
    copies = [(c, key) for c in candidates for key in (c.lane_keys[:1] if one_copy_each else c.lane_keys)]
    return sorted(copies, key=rank)


def rank(copy: Copy) -> tuple[float, Key]:
    return (-score_of(copy), copy[1])


def score_of(copy: Copy) -> float:
    score = copy[0].score
    assert score is not None, "a candidate competes for retention once scored"
    return score


def grouped(copies: list[Copy]) -> list[tuple[Candidate, int]]:
    """[(candidate, copies)] in the rank of each candidate's best copy."""
    counts: dict[Candidate, int] = {}
    for c, _ in copies:
        counts[c] = counts.get(c, 0) + 1
    return list(counts.items())


def written_answer(c: Candidate) -> str | None:
    """The content of the last ``\\boxed{...}`` (braces matched) the path has written, or None. `search/` does
    not grade (`grading/extract.py` reads answers fully, outside it): this reads only the braced box."""
    text = "".join(c.steps())
    start = text.rfind(BOXED)
    if start < 0:
        return None
    depth, begin = 0, start + len(BOXED) - 1
    for end in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[begin + 1:end].strip()
    return None
