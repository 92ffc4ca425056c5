"""Early pruning's exactness as a property (docs/design.md, "Early pruning"): over random scripted traces with
exact 1.0 scores and many ties, `ep-strict` (strict threshold only) retains in every round exactly what `beam`
retains and returns the same paths; `ep` (plus the perfect-score shortcut) is allowed to differ, and does."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_search import decisions_of, logical_paths, run_preset, two_choice_step

SHAPES = [(8, 4), (4, 2), (8, 2), (4, 4)]


def decided(preset, seed, shape, perfect_rate, score_levels, step_fn):
    n, m = shape
    runtime, results = run_preset(preset, n_requests=2, perfect_rate=perfect_rate, score_levels=score_levels,
                                  step_fn=step_fn, beam_size=n, beam_width=m, seed=seed)
    return {rid: decisions_of(runtime, rid) for rid in runtime.finished_ids()}, [logical_paths(r) for r in results]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), shape=st.sampled_from(SHAPES), perfect_rate=st.sampled_from([0.0, 0.2, 0.5]),
       score_levels=st.sampled_from([2, 3, 5, 10_000]), repeated=st.booleans())
def test_ep_strict_keeps_exactly_what_beam_keeps(seed, shape, perfect_rate, score_levels, repeated):
    step_fn = two_choice_step if repeated else None
    assert decided("ep-strict", seed, shape, perfect_rate, score_levels, step_fn) == decided(
        "beam", seed, shape, perfect_rate, score_levels, step_fn)


def test_the_perfect_score_shortcut_may_change_what_ep_keeps():
    differ = sum(decided("ep", seed, (8, 4), 0.5, 3, None) != decided("beam", seed, (8, 4), 0.5, 3, None)
                 for seed in range(6))
    assert differ > 0
