"""DVTS as search-and-learn's sal/search/dvts.py runs it (docs/design.md, "DVTS"): N / M subtrees; per subtree
and round the argmax over all of its M candidates, completed ones included; a completed (or boxed) argmax
ends the subtree and its round's M candidates are its result; the search runs until every subtree ended."""

from specscale.search.tree import CandidateState
from test_search import run_preset

N, M = 8, 4


def subtree(c) -> int:
    return c.key[0] // M


def test_each_subtree_keeps_its_argmax_and_ends_on_a_completed_one():
    runtime, results = run_preset("dvts", n_requests=8, beam_size=N, beam_width=M, max_rounds=8)
    ended_early = 0
    for rid, result in zip(runtime.finished_ids(), results, strict=True):
        search = runtime.search(rid)
        ended_at: dict[int, int] = {}
        for rd in search.rounds:
            groups: dict[int, list] = {}
            for c in rd.candidates:
                groups.setdefault(subtree(c), []).append(c)
            for g, members in groups.items():
                assert g not in ended_at, "a subtree went on after it ended"
                assert len(members) == M
                best = max(members, key=lambda c: (c.score, tuple(-k for k in c.key)))
                if best.state == CandidateState.RETAINED:
                    assert not best.completed and "boxed{" not in "".join(best.steps())
                    assert all(c.state == CandidateState.DROPPED for c in members if c is not best)
                else:  # the subtree ended here: its round's candidates are its result
                    assert all(c.state == CandidateState.COMPLETED for c in members)
                    ended_at[g] = rd.index
                    ended_early += best.completed and rd.index < search.last_round
        assert sorted(ended_at) == list(range(N // M))  # every subtree ended
        assert sum(p.copies for p in result.paths) == N  # M results per subtree
    assert ended_early, "no subtree ended on a completed argmax before the round cap"
