"""`beam-sync`, search-and-learn's batched loop as a preset (docs/design.md, "The lock-step baseline"): the requests
in flight advance round by round together — every one generates its round, then all rounds are scored in one
PRM call — and they are admitted in waves of max_concurrency. On the scripted backend (seeded, exact) it must
keep beam search's paths and change only when the work runs."""

from dataclasses import asdict

from search_backends import scripted_request, scripted_runtime
from specscale.search.presets import preset_config

SETTINGS = dict(beam_size=4, beam_width=2, max_step_tokens=48)


def _config(preset: str, i: int):
    """Request i's search: rounds capped at 2 + i, so the requests of a wave finish at different rounds."""
    return preset_config(preset, seed=i, max_rounds=2 + i, **SETTINGS)


def _run(preset: str, problems: int, max_concurrency: int, **options):
    finished: list[str] = []
    runtime = scripted_runtime(max_concurrency=max_concurrency,
                               on_finished=lambda request_id, result: finished.append(request_id), **options)
    requests = [scripted_request(i, _config(preset, i), f"q{i}") for i in range(problems)]
    results = runtime.run(requests)
    return results, runtime.take_metrics(), finished


def test_beam_sync_keeps_beams_paths():
    beam, _, _ = _run("beam", 5, 5)
    sync, _, _ = _run("beam-sync", 5, 5)
    assert [[asdict(p) for p in r.paths] for r in sync] == [[asdict(p) for p in r.paths] for r in beam]


def test_every_prm_call_scores_every_round_in_flight():
    """One wave of 4: a call per round, each with every request still searching (the count only falls, as
    requests finish), where `beam` scores each request's round as soon as it is generated."""
    results, metrics, _ = _run("beam-sync", 4, 4)
    per_call = metrics.verifier_batch_requests
    assert per_call[0] == 4
    assert per_call == sorted(per_call, reverse=True)
    assert len(per_call) == max(r.rounds for r in results)
    _, beam_metrics, _ = _run("beam", 4, 4)
    assert len(beam_metrics.verifier_batch_requests) > len(per_call)


def test_waves_start_only_when_the_previous_wave_has_ended():
    """max_concurrency 2, 4 requests: q2 and q3 start together once q0 and q1 have both finished."""
    admitted: list[list[str]] = []
    runtime = scripted_runtime(max_concurrency=2)
    requests = [scripted_request(i, _config("beam-sync", i), f"q{i}") for i in range(4)]
    for request in requests:
        runtime.submit(request)
    while runtime.has_work():
        before = set(runtime.active)
        runtime.step()
        new = sorted(set(runtime.active) - before)
        if new:
            admitted.append(new)
            assert before == set(), f"{new} joined a wave still in flight: {sorted(before)}"
    assert admitted == [["q0", "q1"], ["q2", "q3"]]


def test_continuous_requests_fill_a_freed_slot_at_once():
    """The control: `beam` admits the next request as soon as any slot frees (no waves)."""
    runtime = scripted_runtime(max_concurrency=2)
    for i in range(4):
        runtime.submit(scripted_request(i, _config("beam", i), f"q{i}"))
    joined_beside_others = False
    while runtime.has_work():
        before = set(runtime.active)
        runtime.step()
        joined_beside_others |= bool(set(runtime.active) - before) and bool(before)
    assert joined_beside_others
