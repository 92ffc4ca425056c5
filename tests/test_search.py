"""The search and runtime suite. On every backend (scripted, the bundled toy models, the simulator:
tests/search_backends.py): every preset completes and releases everything, a cancel frees a search's
sequences at once, admission respects max_concurrency. On the scripted backend, exact semantics: strict
pruning keeps what beam keeps, the perfect-score shortcut, CD row counts and paths."""

import pytest
from search_backends import SMALL, scripted_request, scripted_runtime

from specscale.search.presets import PRESETS, preset_config
from specscale.sim.scripted_generator import prefix_only_step


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


def run_preset(name, n_requests=4, step_fn=None, perfect_rate=0.0, **overrides):
    runtime = scripted_runtime(**({} if step_fn is None else {"step_fn": step_fn}), perfect_rate=perfect_rate)
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
             for preset in ("beam", "naive-spec", "ep-strict")}
    assert found["beam"] == found["naive-spec"] == found["ep-strict"]
    assert any(len(rounds) > 2 for rounds in found["beam"].values())  # the test has depth


def test_strict_pruning_cancels_work_that_naive_speculation_keeps():
    naive, _ = run_preset("naive-spec", n_requests=3)
    strict, _ = run_preset("ep-strict", n_requests=3)
    assert sum(strict.generator.rows_per_step) < sum(naive.generator.rows_per_step)


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
    for a, b in zip(plain_results, cd_results):
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
