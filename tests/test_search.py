"""The search and runtime suite. On every backend (scripted, the bundled toy models, the simulator:
tests/search_backends.py): every preset completes and releases everything, a cancel frees a search's
sequences at once, admission respects max_concurrency. On the scripted backend, exact semantics: strict
pruning keeps what beam keeps, the perfect-score shortcut, CD row counts and paths."""

import pytest

from scripted_generator import prefix_only_step, seeded_step
from search_backends import SMALL, scripted_request, scripted_runtime
from specscale.search.lookahead import LookAhead
from specscale.search.presets import PRESETS, preset_config


def logical_paths(result) -> list[tuple[str, int]]:
    """The returned paths as a multiset of texts (copies merged), whatever the physical grouping."""
    merged: dict[str, int] = {}
    for p in result.paths:
        merged[p.text] = merged.get(p.text, 0) + p.copies
    return sorted(merged.items())


def assert_released(runtime) -> None:
    stats = runtime.stats()
    assert stats.live_sequences == 0 and stats.generator_kv.used_blocks == 0, "sequences leaked"
    assert not runtime.has_work() and not runtime.can_progress()


def run_preset(name, n_requests=4, step_fn=None, perfect_rate=0.0, score_levels=10_000, **overrides):
    runtime = scripted_runtime(**({} if step_fn is None else {"step_fn": step_fn}), perfect_rate=perfect_rate,
                               score_levels=score_levels)
    options = dict(beam_size=8, beam_width=4, max_rounds=8, seed=11)
    options.update(overrides)
    requests = [scripted_request(i, preset_config(name, **options), f"r{i}") for i in range(n_requests)]
    results = runtime.run(requests)
    assert_released(runtime)
    return runtime, results


def decisions(runtime) -> dict[str, list]:
    return {rid: [(d.round, d.retained) for d in runtime.search(rid).decisions] for rid in runtime.finished_ids()}


# ---- every backend --------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_completes_and_releases_everything(search_backend, preset):
    runtime = search_backend.runtime(max_concurrency=8)
    beam_size = SMALL["beam_size"]
    requests = [search_backend.request(i, preset_config(preset, **SMALL, seed=11 + i), f"r{i}") for i in range(3)]
    results = runtime.run(requests)
    for result in results:
        assert result.error is None
        assert result.paths and sum(p.copies for p in result.paths) <= beam_size
        assert result.best.score == max(p.score for p in result.paths)
        assert result.usage.generated_tokens >= result.usage.wasted_tokens >= 0
        assert result.usage.output_tokens == sum(p.num_tokens * p.copies for p in result.paths) > 0
    assert runtime.metrics.generation_ticks > 0 and runtime.metrics.verifier_batch_items
    assert_released(runtime)


def test_cancel_mid_search_frees_its_sequences_at_once(search_backend):
    runtime = search_backend.runtime()
    config = preset_config("specscale", **SMALL, seed=3)
    keep = runtime.submit(search_backend.request(0, config, "keep"))
    runtime.step()
    alone = runtime.stats().live_sequences  # the kept request's prompt
    victim = runtime.submit(search_backend.request(1, config, "victim"))
    for _ in range(12):
        runtime.step()
    before = runtime.stats()
    assert before.running == 2 and before.live_sequences > alone
    assert runtime.cancel(victim)
    after = runtime.stats()
    assert after.running == 1 and after.live_sequences < before.live_sequences
    assert after.generator_kv.used_blocks < before.generator_kv.used_blocks  # freed at once, not at the next tick
    assert runtime.result(victim).error == "cancelled"
    while runtime.has_work():
        runtime.step()
    assert runtime.result(keep).error is None
    assert_released(runtime)


def test_admission_respects_max_concurrency(search_backend):
    finished = []
    runtime = search_backend.runtime(max_concurrency=2, on_finished=lambda rid, result: finished.append(rid))
    config = preset_config("beam", beam_size=4, beam_width=2, max_rounds=3, max_step_tokens=48, seed=1)
    for i in range(5):
        runtime.submit(search_backend.request(i, config, None))
    peak = 0
    while runtime.has_work():
        runtime.step()
        peak = max(peak, runtime.stats().running)
    assert peak == 2 and len(finished) == len(runtime.finished_ids()) == 5
    assert_released(runtime)


# ---- exact semantics on the scripted backend ---------------------------------------------------------------
@pytest.mark.parametrize("n,m", [(8, 4), (4, 4), (16, 4), (8, 2)])
def test_strict_pruning_and_naive_speculation_retain_what_beam_retains(n, m):
    found = {preset: decisions(run_preset(preset, n_requests=3, beam_size=n, beam_width=m)[0])
             for preset in ("beam", "naive-spec", "naive-spec-unbounded", "ep-strict")}
    assert found["beam"] == found["naive-spec"] == found["naive-spec-unbounded"] == found["ep-strict"]
    assert any(len(rounds) > 2 for rounds in found["beam"].values())  # the test has depth


def test_strict_pruning_cancels_work_that_naive_speculation_keeps():
    naive, _ = run_preset("naive-spec", n_requests=3)
    strict, _ = run_preset("ep-strict", n_requests=3)
    assert sum(strict.generator.rows_per_step) < sum(naive.generator.rows_per_step)


def test_unbounded_naive_speculation_runs_its_speculative_work_at_real_priority():
    """`naive-spec-unbounded` (the paper's naive speculation) gives its speculative children priority 0, so the
    engine's row budget (which bounds priorities below 0) never holds them back; `naive-spec` ranks them below 0."""
    from specscale.search.protocol import Expand, ScoresArrived, StepFinished
    from specscale.search.search import Search
    from specscale.search.tree import CandidateState

    def speculative_priorities(preset: str) -> list[int]:
        search = Search(preset_config(preset, beam_size=4, beam_width=2, seed=1))
        search.start(0.0)
        first = search.rounds[0].expansions[0]
        search.on(StepFinished(first.id, 100, "a step", 3, (0,), False, 1.0))
        candidate = next(c for c in search.candidates.values())
        actions = search.on(ScoresArrived(candidate.id, (0.5,), None, 1.0))
        assert candidate.state == CandidateState.SCORED
        return [a.priority for a in actions if isinstance(a, Expand)]

    assert speculative_priorities("naive-spec") and all(p < 0 for p in speculative_priorities("naive-spec"))
    assert speculative_priorities("naive-spec-unbounded") and set(speculative_priorities("naive-spec-unbounded")) == {0}


def test_perfect_scores_close_the_round_early():
    runtime, _ = run_preset("ep", n_requests=3, perfect_rate=0.35)
    early = [d for rid in runtime.finished_ids() for d in runtime.search(rid).decisions if d.early]
    assert early, "no round was closed by the shortcut"
    for d in early:
        assert len(d.retained) and sum(n for _, n in d.retained) == 2  # k = 8 / 4
        assert d.finished_candidates < 8  # decided before every candidate had finished


@pytest.mark.parametrize("cd_preset,plain_preset", [("beam+cd", "beam"), ("specscale", "ep-strict")])
def test_dedup_runs_one_row_per_distinct_prefix_and_returns_the_same_paths(cd_preset, plain_preset):
    plain, plain_results = run_preset(plain_preset, step_fn=prefix_only_step, max_rounds=4)
    cd, cd_results = run_preset(cd_preset, step_fn=prefix_only_step, max_rounds=4)
    for a, b in zip(plain_results, cd_results, strict=True):
        assert logical_paths(a) == logical_paths(b)
    # every child of a prefix writes the same step here, so CD needs one row per request and round
    assert max(cd.generator.rows_per_step) <= 4 < max(plain.generator.rows_per_step)


def test_dedup_round_zero_matches_separate_children_copy_for_copy():
    plain, _ = run_preset("beam", n_requests=2, max_rounds=1)
    cd, _ = run_preset("beam+cd", n_requests=2, max_rounds=1)
    for rid in plain.finished_ids():
        assert logical_paths(plain.result(rid)) == logical_paths(cd.result(rid))


def test_cd_rows_that_split_take_the_ids_their_expansion_reserved():
    """A row of multiplicity m splits into at most m rows, all named by the runtime: none is unknown to it."""
    runtime, _ = run_preset("beam+cd", n_requests=2, max_rounds=3)
    assert max(runtime.generator.rows_per_step) > 2  # rows did split
    assert runtime.metrics.summary()["physical_to_logical"] < 1.0


def test_a_runtime_driven_tick_by_tick_leaves_nothing_behind_once_idle(search_backend):
    """Drivers that step the runtime themselves (the server, `bench latency`) stop when it has no work:
    the operations of its last tick (the finished search's releases) must be handed over by then."""
    runtime = search_backend.runtime(max_concurrency=2)
    generator = runtime.generator
    for i in range(4):  # on the simulator, request 1's last tick releases a sequence
        runtime.submit(search_backend.request(i, preset_config("beam", **SMALL, seed=5), f"r{i}"))
        while runtime.has_work():
            runtime.step()
        assert generator.num_live_sequences == 0 and generator.kv_usage.used_blocks == 0


def two_choice_step(prefix: tuple, seed: int, final: bool) -> list[int]:
    """Each child writes one of two steps (by its seed's parity): siblings often write the same text, so CD
    rows carry several lanes and identical paths compete in selection."""
    return seeded_step(prefix, seed % 2, final)


@pytest.mark.parametrize("score_levels", [10_000, 4], ids=["few-ties", "many-ties"])
@pytest.mark.parametrize("step_fn", [None, two_choice_step], ids=["distinct-steps", "repeated-steps"])
@pytest.mark.parametrize("plain_preset,cd_preset", [("beam", "beam+cd"), ("ep-strict", "ep+cd")])
def test_cd_follows_the_plain_variants_paths_round_for_round(plain_preset, cd_preset, step_fn, score_levels):
    """docs/design.md, "Seeds": each logical child of a CD row samples from its own tree position's seed,
    so with equal scores CD retains and returns exactly what its plain twin does (the old search keyed a
    CD piece by its finishing order and thinned speculative copies at random)."""
    plain, plain_results = run_preset(plain_preset, step_fn=step_fn, score_levels=score_levels)
    cd, cd_results = run_preset(cd_preset, step_fn=step_fn, score_levels=score_levels)
    for rid in plain.finished_ids():
        assert decisions_of(cd, rid) == decisions_of(plain, rid)
    for a, b in zip(plain_results, cd_results, strict=True):
        assert logical_paths(a) == logical_paths(b)
    assert any(len(decisions_of(plain, rid)) > 2 for rid in plain.finished_ids())


def decisions_of(runtime, rid) -> list:
    """Each decided round's retained paths as (steps, copies), copies of one path merged."""
    out = []
    for d in runtime.search(rid).decisions:
        merged: dict = {}
        for steps, copies in d.retained:
            merged[steps] = merged.get(steps, 0) + copies
        out.append((d.round, sorted(merged.items())))
    return out


@pytest.mark.parametrize("preset", ["beam", "beam+cd", "ep-strict", "ep+cd", "specscale", "fasttts"])
def test_filter_duplicates_retains_distinct_paths_only_when_asked(preset):
    """search-and-learn's filter_duplicates: off by default (identical paths may fill the beam), on every
    beam variant when asked (every decided round retains distinct paths, one copy each)."""
    def retained_copies(runtime):
        return [[(steps, n) for steps, n in d.retained]
                for rid in runtime.finished_ids() for d in runtime.search(rid).decisions]

    default, _ = run_preset(preset, step_fn=two_choice_step)
    filtered, results = run_preset(preset, step_fn=two_choice_step, filter_duplicates=True)
    assert any(len({steps for steps, _ in r}) < sum(n for _, n in r) for r in retained_copies(default))
    for retained in retained_copies(filtered):
        assert all(n == 1 for _, n in retained) and len({steps for steps, _ in retained}) == len(retained)
    assert all(r.error is None and r.paths for r in results)


def test_strict_pruning_with_filter_duplicates_retains_what_beam_retains():
    decisions = {}
    for preset in ("beam", "ep-strict"):
        runtime, _ = run_preset(preset, step_fn=two_choice_step, filter_duplicates=True, score_levels=4)
        decisions[preset] = {rid: decisions_of(runtime, rid) for rid in runtime.finished_ids()}
    assert decisions["beam"] == decisions["ep-strict"]


def test_every_preset_is_a_composition_of_policy_objects():
    from specscale.search.dedup import DEDUP
    from specscale.search.pruning import PRUNING, PerfectShortcut
    from specscale.search.search import Search
    from specscale.search.selection import BeamSelection, BestOfNSelection, DVTSSelection
    from specscale.search.verification import VERIFICATION

    expected = {
        "beam": (BeamSelection, "round", 0, False, ("none", False), False),
        "beam-sync": (BeamSelection, "lock_step", 0, False, ("none", False), False),
        "beam+cd": (BeamSelection, "round", 0, False, ("none", False), True),
        "beam+cd+lv": (BeamSelection, "lazy", 0, False, ("none", False), True),
        "best-of-n": (BestOfNSelection, "round", 0, False, ("none", False), False),
        "dvts": (DVTSSelection, "round", 0, False, ("none", False), False),
        "naive-spec": (BeamSelection, "immediate", 1, False, ("none", False), False),
        "naive-spec-unbounded": (BeamSelection, "immediate", 1, False, ("none", False), False),  # priority 0
        "fasttts": (BeamSelection, "per_request", 0, True, ("none", False), False),
        "fasttts-xb": (BeamSelection, "round", 0, True, ("none", False), False),
        "fasttts-db": (BeamSelection, "per_request", 0, True, ("none", False), False),  # + dynamic branching
        "ep-strict": (BeamSelection, "immediate", 1, False, ("strict", False), False),
        "ep-strict+ties": (BeamSelection, "immediate", 1, False, ("strict_ties", False), False),
        "ep": (BeamSelection, "immediate", 1, False, ("strict", True), False),
        "ep+cd": (BeamSelection, "immediate", 1, False, ("strict", True), True),
        "specscale": (BeamSelection, "lazy", 1, False, ("strict", True), True),
        "specscale-adaptive": (BeamSelection, "lazy", 1, False, ("strict", True), True),  # + the adaptive flush policy
        "specscale-nospec": (BeamSelection, "lazy", 0, False, ("strict", True), True),
    }
    assert set(expected) <= set(PRESETS)  # the named presets' compositions (a new preset needs no line here)
    for name, (selection, verification, depth, lookahead, pruning, cd) in expected.items():
        search = Search(preset_config(name))
        assert type(search.selection) is selection and VERIFICATION.name_of(search.verification) == verification
        assert search.speculation.eager_depth == depth and isinstance(search.lookahead, LookAhead) is lookahead
        assert (PRUNING.name_of(search.pruning), type(search.shortcut) is PerfectShortcut) == pruning
        assert DEDUP.name_of(search.dedup) == ("on" if cd else "off") and not search.config.filter_duplicates
        assert search.config.dynamic_branching is (name == "fasttts-db")
