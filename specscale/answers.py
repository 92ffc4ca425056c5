"""A finished search's answers: each completed path's final answer and the votes over them, grouped by
mathematical equivalence (`grading/`, math-verify). `search/` hands back paths and never grades; the
composition roots (`Pipeline`, `Simulation`) give `read_answers` to the `SearchRuntime` they build, which
calls it as a request finishes (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import replace

from specscale.grading import AnswerGrader, extract_answer, shared_grader
from specscale.search.result import CompletedPath, SearchResult

# Votes are counted in the thread that reads the result (the server's engine thread): a comparison
# that needs math-verify gets this long before it counts as "different answers".
VOTE_TIMEOUT_S = 1.0


def read_answers(result: SearchResult) -> None:
    """Fill in, in place, each path's answer, the best path's answer and the two votes."""
    result.paths = [replace(p, answer=extract_answer(p.text)) for p in result.paths]
    result.best = result.paths[0] if result.paths else None
    result.answer = result.best.answer if result.best else None
    result.weighted_vote, result.majority_vote = votes(result.paths)


def votes(paths: list[CompletedPath], grader: AnswerGrader | None = None) -> tuple[str | None, str | None]:
    """(weighted vote: the answer whose group has the largest sum of scores, majority vote: the largest
    count), each path counted `copies` times. Answers are grouped by mathematical equivalence
    (`AnswerGrader.group`: ``\\frac{1}{2}``, ``0.5`` and ``1/2`` are one answer; plain numbers never leave
    this thread); a group is named by its first member, i.e. the best-ranked path's spelling, and a tie
    goes to the group that appears first. Paths without an answer do not vote."""
    answered = [p for p in paths if p.answer is not None]
    grader = grader or shared_grader()
    groups = grader.group([p.answer for p in answered], timeout_s=VOTE_TIMEOUT_S)
    names: dict[int, str] = {}
    weighted: dict[int, float] = {}
    counts: dict[int, int] = {}
    for p, group in zip(answered, groups, strict=True):
        names.setdefault(group, p.answer)
        weighted[group] = weighted.get(group, 0.0) + p.score * p.copies
        counts[group] = counts.get(group, 0) + p.copies
    best_weighted = max(weighted, key=weighted.get, default=None)
    best_count = max(counts, key=counts.get, default=None)
    return names.get(best_weighted), names.get(best_count)

