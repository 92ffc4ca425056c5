"""KV-aware retention (`search/retention.py`, docs/design.md "KV-aware retention"; issue 46, point 3): among the
copies within `retention_margin` of a round's k-th best score, a path with a new written answer first, then the
one adding the fewest tokens of KV to the kept paths; outside the margin the score decides; "score", the
default, is beam's top-k. Hand-made trees for the decisions, the scripted backend for the search around them."""

import pytest

from specscale.config import SearchConfig
from specscale.search import policies
from specscale.search.presets import preset_config
from specscale.search.pruning import StrictPruning, TiedStrictPruning
from specscale.search.retention import RETENTION, KeptPaths, KVRetention, ScoreRetention, written_answer
from specscale.search.search import Search
from specscale.search.selection import BeamSelection
from specscale.search.tree import Candidate, CandidateState, Expansion
from test_search import decisions_of, run_preset


class Tree:
    """A hand-made search tree: a candidate is one step of `tokens` tokens under its parent."""

    def __init__(self):
        self.ids = iter(range(10_000))

    def step(self, parent, lane_keys, score, text="step", tokens=10, state=CandidateState.SCORED) -> Candidate:
        """A candidate standing for len(lane_keys) logical copies (CD lanes), its lanes at these tree positions."""
        e = Expansion(next(self.ids), parent, 0 if parent is None else parent.round + 1, tuple(lane_keys), None, 0.0)
        lanes = tuple(range(len(lane_keys)))
        return Candidate(next(self.ids), None, e, lanes, text, tokens, False, 0.0, 0, state=state, score=score)


def kv(margin=0.05) -> KVRetention:
    return KVRetention(SearchConfig(retention="kv", retention_margin=margin))


def kept(retained) -> list[tuple[float, int]]:
    return [(c.score, n) for c, n in retained]


@pytest.fixture
def two_parents():
    """Round 1 of a search that kept P and Q: P's children a (0.80) and b, Q's child c (0.72); k = 2."""
    tree = Tree()
    p = tree.step(None, [(0,)], 0.9, state=CandidateState.RETAINED)
    q = tree.step(None, [(1,)], 0.5, state=CandidateState.RETAINED)
    return tree, p, q


# ---- the decisions, on hand-made trees ------------------------------------------------------------------------
def test_within_the_margin_the_candidate_sharing_kv_wins(two_parents):
    tree, p, q = two_parents
    a, b = tree.step(p, [(0, 0, 0)], 0.80), tree.step(p, [(0, 1, 0)], 0.70)
    c = tree.step(q, [(1, 0, 0)], 0.72)
    assert ScoreRetention(SearchConfig()).retain([a, b, c], 2, False) == [(a, 1), (c, 1)]
    assert kv().retain([a, b, c], 2, False) == [(a, 1), (b, 1)]  # b shares P with a: 10 tokens, c adds 20


def test_outside_the_margin_the_score_decides(two_parents):
    tree, p, q = two_parents
    a, b = tree.step(p, [(0, 0, 0)], 0.80), tree.step(p, [(0, 1, 0)], 0.66)
    c = tree.step(q, [(1, 0, 0)], 0.72)
    assert kv().retain([a, b, c], 2, False) == [(a, 1), (c, 1)]  # b is 0.06 below the k-th best
    b.score = 0.70
    assert kv(margin=0.01).retain([a, b, c], 2, False) == [(a, 1), (c, 1)]


def test_copies_far_above_the_kth_best_are_kept_by_score_and_the_best_always(two_parents):
    tree, p, q = two_parents
    far = tree.step(q, [(1, 0, 0)], 0.95)  # more than the margin above the k-th best: kept whatever it costs
    a, b = tree.step(p, [(0, 0, 0)], 0.74), tree.step(p, [(0, 1, 0)], 0.73)
    c = tree.step(q, [(1, 1, 0)], 0.72)
    assert kv().retain([a, b, c, far], 3, False) == [(far, 1), (a, 1), (c, 1)]  # c shares Q with far
    best = tree.step(q, [(1, 2, 0)], 0.75)  # within the margin, yet the best copy: always kept
    assert kv().retain([a, b, best], 2, False) == [(best, 1), (a, 1)]


def test_a_path_with_a_new_answer_wins_over_a_cheaper_one(two_parents):
    tree, p, q = two_parents
    a = tree.step(p, [(0, 0, 0)], 0.80, text="so \\boxed{5}")
    b = tree.step(p, [(0, 1, 0)], 0.74, text="so \\boxed{5}")
    c = tree.step(q, [(1, 0, 0)], 0.72, text="so \\boxed{6}")
    assert kv().retain([a, b, c], 2, False) == [(a, 1), (c, 1)]  # coverage: 6 is an answer no kept path has
    c.text = "so \\boxed{5}"
    assert kv().retain([a, b, c], 2, False) == [(a, 1), (b, 1)]  # the same answer: KV decides


def test_a_further_cd_copy_of_a_kept_candidate_adds_no_kv(two_parents):
    tree, p, q = two_parents
    a = tree.step(p, [(0, 0, 0)], 0.80)
    twins = tree.step(q, [(1, 0, 0), (1, 1, 0)], 0.76)  # one CD row, two logical copies
    b = tree.step(p, [(0, 1, 0)], 0.77, tokens=15)
    paths = KeptPaths()
    paths.add((twins, (1, 0, 0)))
    assert paths.added_tokens(twins) == 0 and paths.added_tokens(b) == 25 and paths.added_tokens(a) == 20
    # k = 3: after a, b (15 tokens under P) beats the twins (20 under Q); then the twins' second copy is free
    assert kept(kv().retain([a, b, twins], 4, False)) == [(0.80, 1), (0.77, 1), (0.76, 2)]
    assert kv().retain([a, b, twins], 3, False) == [(a, 1), (b, 1), (twins, 1)]


def test_with_filter_duplicates_a_candidate_counts_once(two_parents):
    tree, p, q = two_parents
    a = tree.step(p, [(0, 0, 0), (0, 1, 0)], 0.80)
    c = tree.step(q, [(1, 0, 0)], 0.79)
    assert kv().retain([a, c], 2, one_copy_each=True) == [(a, 1), (c, 1)]


def test_written_answers_read_the_last_braced_box():
    tree = Tree()
    root = tree.step(None, [(0,)], 0.5, text="2 + 3 = 5. \\boxed{5}\n\n")
    assert written_answer(tree.step(root, [(0, 0, 0)], 0.5, text="Or \\boxed{\\frac{1}{2}} ")) == "\\frac{1}{2}"
    assert written_answer(tree.step(root, [(0, 1, 0)], 0.5, text="then")) == "5"
    assert written_answer(tree.step(None, [(1,)], 0.5, text="\\boxed{7")) is None
    assert written_answer(tree.step(None, [(2,)], 0.5, text="no box")) is None


# ---- the default, the registry and the config -----------------------------------------------------------------
def test_score_is_the_default_and_is_beams_top_k(two_parents):
    tree, p, q = two_parents
    children = [tree.step(p, [(0, i, 0)], s) for i, s in enumerate((0.8, 0.7, 0.7, 0.4))]
    children.append(tree.step(q, [(1, 0, 0), (1, 1, 0)], 0.7))
    assert SearchConfig().retention == "score"
    assert type(BeamSelection(SearchConfig()).retention) is ScoreRetention
    for k in (1, 2, 3, 5):
        assert ScoreRetention(SearchConfig()).retain(children, k, False) == policies.top_k_copies(children, k)
    assert ScoreRetention(SearchConfig()).lowest_kept(0.7) == 0.7 and kv(0.05).lowest_kept(0.7) == 0.7 - 0.05
    one_kept = KVRetention(SearchConfig(beam_size=4, beam_width=4, retention="kv", retention_margin=0.05))
    assert one_kept.lowest_kept(0.7) == 0.7  # k = 1: the best copy is the one kept, nothing below it


def test_the_presets_and_bad_fields():
    assert set(RETENTION.names()) == {"score", "kv"}
    for preset in ("beam+kv", "specscale+kv"):
        assert type(Search(preset_config(preset)).selection.retention) is KVRetention
    assert preset_config("specscale+kv").pruning == "strict" and preset_config("specscale+kv").dedup
    with pytest.raises(ValueError, match="retention must be one of"):
        preset_config("beam[retention=cheap]")
    with pytest.raises(ValueError, match="retention_margin"):
        preset_config("beam+kv[retention_margin=1.5]")
    # the tie-aware threshold breaks ties by tree position, which KV-aware retention does not: it is strict then
    tied = Search(preset_config("ep-strict+ties[retention=kv]")).pruning
    assert isinstance(tied, TiedStrictPruning) and isinstance(tied, StrictPruning)


# ---- the search around them, on the scripted backend ----------------------------------------------------------
def held_tokens_per_round(runtime) -> float:
    """Characters of the distinct path prefixes a decided round kept (the KV its retained paths hold), per round."""
    held = []
    for rid in runtime.finished_ids():
        for d in runtime.search(rid).decisions:
            prefixes = {steps[:i + 1] for steps, _ in d.retained for i in range(len(steps))}
            held.append(sum(len(prefix[-1]) for prefix in prefixes))
    return sum(held) / len(held)


def retained_rounds(preset, **overrides) -> dict:
    runtime, _ = run_preset(preset, n_requests=6, **overrides)
    return {rid: decisions_of(runtime, rid) for rid in runtime.finished_ids()}


def test_a_margin_of_zero_without_ties_retains_what_beam_retains():
    assert retained_rounds("beam+kv[retention_margin=0]") == retained_rounds("beam")


def test_with_one_path_kept_it_is_beam_and_ep_prunes_as_before():
    """N = M: k = 1, the best copy is kept, so beam+kv is beam and specscale+kv's EP cancels what specscale's does."""
    assert retained_rounds("beam+kv[retention_margin=0.3]", beam_width=8) == retained_rounds("beam", beam_width=8)
    kv_runtime, _ = run_preset("specscale+kv[retention_margin=0.3]", n_requests=6, beam_width=8)
    plain_runtime, _ = run_preset("specscale", n_requests=6, beam_width=8)
    assert sum(kv_runtime.generator.rows_per_step) == sum(plain_runtime.generator.rows_per_step)


def test_the_kv_preset_keeps_less_kv_than_beam_and_releases_everything():
    """20 searches, N = 8, M = 2 (k = 4), the scripted PRM's scores spread over [0, 1]: a wide margin."""
    beam, _ = run_preset("beam", n_requests=20, beam_width=2)
    kv_beam, results = run_preset("beam+kv[retention_margin=0.2]", n_requests=20, beam_width=2)
    assert held_tokens_per_round(kv_beam) < 0.9 * held_tokens_per_round(beam)  # measured: 80.5 against 95.8
    assert all(r.error is None and r.paths for r in results)


@pytest.mark.parametrize("margin", [0.05, 0.2])
def test_strict_pruning_never_cancels_what_kv_retention_keeps(margin):
    """EP's threshold is the k-th best less the margin: ep-strict with KV-aware retention retains, round for
    round, what beam with it retains (and differs from plain beam: the test has power)."""
    plain = retained_rounds(f"beam+kv[retention_margin={margin}]", beam_width=2)
    assert retained_rounds(f"ep-strict[retention=kv,retention_margin={margin}]", beam_width=2) == plain
    assert plain != retained_rounds("beam", beam_width=2)


def test_specscale_kv_completes_on_the_scripted_backend():
    _, results = run_preset("specscale+kv", n_requests=6, beam_width=2)
    assert all(r.error is None and r.paths and r.best.score == max(p.score for p in r.paths) for r in results)
