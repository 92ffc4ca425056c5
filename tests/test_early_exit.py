"""Early exit (`search/early_exit.py`, docs/design.md "Early exit"; issue 46, point 2): the exact positive exit
returns exactly the path, so the answer, its search returns without it, on every problem and seed, and generates
less on some; the soft one stops at a certainty threshold; the negative one ends a stalled search with its best
paths and says so; the runtime gives the freed slot to the next request at once."""

import pytest

from search_backends import scripted_request, scripted_runtime
from specscale.config import SearchConfig
from specscale.search.early_exit import (
    CERTAIN,
    EXIT,
    SETTLED,
    STALLED,
    CertainExit,
    ExactExit,
    ExactStallExit,
    ExitedResult,
    NoExit,
    Rival,
)
from specscale.search.presets import preset_config
from specscale.search.search import Search
from specscale.search.tree import Candidate, CandidateState, Expansion, Round
from test_search import assert_released, two_choice_step

SETTINGS = dict(beam_size=8, beam_width=2, max_rounds=8, max_step_tokens=48)


def run(variant, seeds, problems=8, perfect_rate=0.1, score_levels=10_000, max_concurrency=8, step_fn=None,
        **overrides):
    """{(seed, problem): result} of one variant on the scripted backend, and the runtimes' generated tokens."""
    found = {}
    for seed in seeds:
        runtime = scripted_runtime(max_concurrency=max_concurrency, perfect_rate=perfect_rate,
                                   score_levels=score_levels, **({} if step_fn is None else {"step_fn": step_fn}))
        config = preset_config(variant, seed=seed, **dict(SETTINGS, **overrides))
        results = runtime.run([scripted_request(i, config, f"{seed}-{i}") for i in range(problems)])
        assert_released(runtime)
        found.update({(seed, i): r for i, r in enumerate(results)})
    return found


def generated(results) -> int:
    return sum(r.usage.generated_tokens for r in results.values())


def exit_of(result) -> str:
    return result.early_exit if isinstance(result, ExitedResult) else ""


# ---- the exact positive exit: the same answer on every problem-seed ----------------------------------------
@pytest.mark.parametrize("base,overrides", [
    ("beam", {}), ("specscale", {}), ("beam+cd", {}), ("ep-strict", {}), ("dvts", {}),
    ("beam", {"beam_size": 4, "beam_width": 4}), ("specscale", {"aggregation": "min", "perfect_rate": 0.7}),
    ("beam", {"aggregation": "mean", "perfect_rate": 0.5}),
], ids=["beam", "specscale", "beam+cd", "ep-strict", "dvts", "beam-N4M4", "specscale-min", "beam-mean"])
@pytest.mark.parametrize("scores", [dict(perfect_rate=0.1), dict(perfect_rate=0.3, score_levels=4)],
                         ids=["some-perfect", "many-ties"])
def test_the_exact_exit_returns_the_searchs_own_answer_on_every_problem_seed(base, overrides, scores):
    """One request in flight: speculation and the perfect-score shortcut depend on timing, and with others in
    flight an exit moves their timing (beam's answers do not depend on it: the next test runs 8 at once)."""
    settings = dict(scores, **overrides)
    plain = run(base, range(6), max_concurrency=1, **settings)
    early = run(f"{base}[early_exit=exact]", range(6), max_concurrency=1, **settings)
    assert plain.keys() == early.keys() and len(plain) == 48
    for key in plain:
        a, b = plain[key], early[key]
        assert (b.answer, b.best.text, b.best.score) == (a.answer, a.best.text, a.best.score), key
        assert b.usage.generated_tokens <= a.usage.generated_tokens, key
    fired = [key for key in early if exit_of(early[key]) == SETTLED]
    assert fired, "the exit never fired: the test has no power"
    assert all(early[key].best.score == 1.0 for key in fired)
    assert any(early[key].usage.generated_tokens < plain[key].usage.generated_tokens for key in fired)
    assert generated(early) < generated(plain)


def test_the_beam_preset_over_many_seeds_and_the_repeated_step_workload():
    """`beam+exit` against `beam`, 8 in flight: 20 seeds x 8 problems; and `specscale+exit` on a workload where
    siblings repeat steps (CD rows), one in flight."""
    for step_fn, preset, in_flight in ((None, "beam+exit", 8), (two_choice_step, "specscale+exit", 1)):
        base = preset.removesuffix("+exit")
        plain = run(base, range(20), step_fn=step_fn, max_concurrency=in_flight)
        early = run(preset, range(20), step_fn=step_fn, max_concurrency=in_flight)
        assert all(early[k].best.text == plain[k].best.text and early[k].answer == plain[k].answer for k in plain)
        assert generated(early) < generated(plain)


def test_without_perfect_scores_the_exact_exit_never_fires():
    """Below 1.0 any running path may still finish at 1.0 with another answer: nothing is settled early."""
    plain = run("beam", range(3), perfect_rate=0.0)
    early = run("beam+exit", range(3), perfect_rate=0.0)
    assert not any(exit_of(r) for r in early.values())
    assert generated(early) == generated(plain)


# ---- the exact rule on hand-made trees ---------------------------------------------------------------------
class Tree:
    """A hand-made search as its exit policy sees it (SearchOps' rounds and last_decided)."""

    def __init__(self):
        self.rounds: list[Round] = []
        self.last_decided = -1
        self.ids = iter(range(10_000))

    def expansion(self, parent, round_index, keys, pending=()):
        while len(self.rounds) <= round_index:
            self.rounds.append(Round(len(self.rounds)))
        e = Expansion(next(self.ids), parent, round_index, tuple(keys), None, 0.0)
        e.pending = set(pending)
        self.rounds[round_index].expansions.append(e)
        return e

    def candidate(self, e, lane, score, completed, state=CandidateState.SCORED):
        c = Candidate(next(self.ids), None, e, (lane,), "step", 1, completed, 0.0, 0, state=state, score=score)
        e.finished.append(c)
        self.rounds[e.round].candidates.append(c)
        return c


def exact(**fields):
    return ExactExit(SearchConfig(**fields))


def test_a_perfect_completed_path_ahead_of_every_rival_settles_the_answer():
    tree = Tree()
    root = tree.expansion(None, 0, [(0,), (1,)])
    leader = tree.candidate(root, 0, 1.0, completed=True, state=CandidateState.COMPLETED)
    running = tree.candidate(root, 1, 0.99, completed=False, state=CandidateState.RETAINED)
    tree.last_decided = 0
    tree.expansion(running, 1, [(1, 0, 0), (1, 0, 1)], pending=(0, 1))
    found = exact().after_score(tree, [leader])
    assert found is not None and found.reason == SETTLED


def test_a_rival_that_could_tie_at_one_point_zero_and_win_on_tree_position_blocks_it():
    tree = Tree()
    root = tree.expansion(None, 0, [(0,), (1,)])
    running = tree.candidate(root, 0, 0.5, completed=False, state=CandidateState.RETAINED)
    leader = tree.candidate(root, 1, 1.0, completed=True, state=CandidateState.COMPLETED)
    tree.last_decided = 0
    tree.expansion(running, 1, [(0, 0, 0)], pending=(0,))  # its child (0, 0, 0, 0) ranks before (1, 0) on a tie
    assert exact().after_score(tree, [leader]) is None


def test_a_leader_below_one_is_never_settled_while_anything_runs():
    tree = Tree()
    root = tree.expansion(None, 0, [(0,), (1,)])
    leader = tree.candidate(root, 0, 0.999, completed=True, state=CandidateState.COMPLETED)
    running = tree.candidate(root, 1, 0.01, completed=False, state=CandidateState.RETAINED)
    tree.last_decided = 0
    tree.expansion(running, 1, [(1, 0, 0)], pending=(0,))
    assert exact().after_score(tree, [leader]) is None
    # the soft rule: 0.999 >= the threshold and above what the running path's parent scored
    soft = CertainExit(SearchConfig(exit_certainty=0.9)).after_score(tree, [leader])
    assert soft is not None and soft.reason == CERTAIN
    assert CertainExit(SearchConfig(exit_certainty=1.0)).after_score(tree, [leader]) is None


def test_a_completed_scored_candidate_of_the_round_being_decided_counts_as_finished_for_beam_only():
    tree = Tree()
    root = tree.expansion(None, 0, [(0,), (1,)], pending=(1,))
    leader = tree.candidate(root, 0, 1.0, completed=True)  # scored, not yet pooled: beam pools it at the decision
    found = exact().after_score(tree, [])
    assert found is not None and found.pooled == (leader,)
    assert exact(selection="dvts").after_score(tree, []) is None  # DVTS pools by subtree: not certain


def test_the_rank_of_a_rival_is_its_bound_then_its_lowest_key():
    policy = exact()
    tree = Tree()
    root = tree.expansion(None, 0, [(3,)])
    leader = tree.candidate(root, 0, 1.0, completed=True, state=CandidateState.COMPLETED)
    assert policy._leads(leader, [Rival(1.0, (4, 0))])
    assert not policy._leads(leader, [Rival(1.0, (2, 0, 5, 0))])
    assert policy._leads(leader, [Rival(0.7, (0, 0))])


# ---- the soft exit -------------------------------------------------------------------------------------------
def test_the_soft_exit_stops_more_often_and_may_change_the_answer():
    plain = run("specscale", range(4), perfect_rate=0.0)
    soft = run("specscale+exit-soft[exit_certainty=0.8]", range(4), perfect_rate=0.0)
    fired = [k for k in soft if exit_of(soft[k]) == CERTAIN]
    assert fired and all(soft[k].best.score >= 0.8 for k in fired)
    assert generated(soft) < generated(plain)


# ---- the negative exit ---------------------------------------------------------------------------------------
def test_a_stalled_search_ends_with_its_best_paths_and_says_so():
    plain = run("beam", range(3), perfect_rate=0.0)
    stalled = run("beam[early_exit=stall,exit_floor=1.0,exit_stall_rounds=1]", range(3), perfect_rate=0.0)
    fired = [k for k in stalled if exit_of(stalled[k]) == STALLED]
    assert fired
    for k in fired:
        r = stalled[k]
        assert r.paths and r.best is not None and r.rounds < plain[k].rounds
        assert r.best.score == max(p.score for p in r.paths)
    assert generated(stalled) < generated(plain)


def test_a_floor_of_zero_never_ends_a_search():
    plain = run("beam", range(2), perfect_rate=0.0)
    never = run("beam[early_exit=stall,exit_floor=0.0,exit_stall_rounds=1]", range(2), perfect_rate=0.0)
    assert not any(exit_of(r) for r in never.values())
    assert all(never[k].best.text == plain[k].best.text for k in plain)


def test_the_stall_counter_counts_decided_rounds_without_a_rise():
    policy = ExactStallExit(SearchConfig(exit_floor=0.6, exit_stall_rounds=2))
    tree = Tree()
    root = tree.expansion(None, 0, [(0,)])
    c = tree.candidate(root, 0, 0.4, completed=False)
    tree.last_decided = 0
    outcomes = []
    for score in (0.4, 0.3, 0.4, 0.5, 0.5, 0.45):
        c.score = score
        found = policy.after_decision(tree, [], [(c, 1)])
        outcomes.append(None if found is None else found.reason)
    # rounds without a rise: 0, 1, 2 (exit), then 0 after 0.5, 1, 2 (exit)
    assert outcomes == [None, None, STALLED, None, None, STALLED]
    assert policy.after_decision(tree, [], [(c, 1)]).pooled == (c,)  # nothing completed: its running paths


# ---- composition, config and the freed slot -------------------------------------------------------------
def test_the_presets_compose_with_specscale():
    for name, policy in (("specscale+exit", ExactExit), ("specscale+exit-soft", CertainExit),
                         ("specscale+exit-stall", ExactStallExit)):
        config = preset_config(name)
        search = Search(config)
        assert type(search.exit) is policy and config.dedup and config.verification == "lazy"
        assert config.speculation == "eager" and config.perfect_shortcut and config.pruning == "strict"
    assert type(Search(preset_config("specscale")).exit) is NoExit
    assert set(EXIT.names()) == {"none", "exact", "certain", "stall", "exact+stall", "certain+stall"}


@pytest.mark.parametrize("fields,message", [
    ({"early_exit": "sometimes"}, "early_exit must be one of"), ({"exit_certainty": 0.0}, "exit_certainty"),
    ({"exit_stall_rounds": 0}, "exit_stall_rounds"), ({"exit_floor": 1.5}, "exit_floor"),
])
def test_bad_fields_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        preset_config("beam", **fields)


def test_the_runtime_admits_the_next_request_when_a_search_exits():
    """One slot: the second request starts at the tick the first one's exit frees it."""
    for seed in range(40):
        runtime = scripted_runtime(max_concurrency=1, perfect_rate=0.2)
        config = preset_config("beam+exit", seed=seed, **SETTINGS)
        first, second = runtime.run([scripted_request(0, config, "a"), scripted_request(1, config, "b")])
        if exit_of(first) == SETTLED:
            assert second.timings.queued_s == pytest.approx(first.timings.total_s)
            assert_released(runtime)
            return
    pytest.fail("no first request exited early")
