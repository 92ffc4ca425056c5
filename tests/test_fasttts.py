"""The FastTTS baseline as FastTTS runs it (docs/design.md, "FastTTS"), on the scripted backend: dynamic
branching on min-subtracted scores, the live-sequence valve per request (force-finishing the oldest
LookAhead continuations), a head start for every retained copy, and which steps one PRM call verifies."""

import pytest
from fake_backend import ScriptedEngine, ScriptedVerifier

from specscale.search.branching import dynamic_children
from specscale.search.presets import preset_config
from specscale.search.runtime import SearchRequest, SearchRuntime
from specscale.search.tree import CandidateState
from specscale.sim.clock import VirtualClock

PROMPT = [1, 2, 3, 4, 5]


class Scored:
    def __init__(self, score):
        self.score = score


def children(scores, slots):
    return dynamic_children([(Scored(s), 1) for s in scores], slots)


def test_dynamic_branching_subtracts_the_minimum_score():
    assert children([0.9, 0.7], 8) == [8, 0]  # raw weights gave 4 / 4 (5 / 3 at best)
    assert children([0.9, 0.8, 0.7, 0.7], 8) == [5, 3, 0, 0]
    assert children([0.6, 0.6, 0.6, 0.6], 4) == [1, 1, 1, 1]  # equal parents: uniform
    assert children([0.5, 0.5], 8) == [4, 4]
    assert sum(children([0.91, 0.33, 0.52], 12)) == 12


class RecordingVerifier(ScriptedVerifier):
    """Remembers, per PRM call, the (question, number of steps) of every path it scored."""

    def __init__(self, clock):
        super().__init__(clock)
        self.calls: list[list[tuple[str, int]]] = []

    def score(self, requests):
        self.calls.append([(r.question, len(r.steps)) for r in requests])
        return super().score(requests)


def run(preset, n_requests=4, **overrides):
    clock = VirtualClock()
    engine, verifier = ScriptedEngine(clock), RecordingVerifier(clock)
    runtime = SearchRuntime(engine, verifier, clock=clock, max_concurrency=32, lv_threshold_tokens=40)
    options = dict(beam_size=8, beam_width=4, max_rounds=6, seed=7)
    options.update(overrides)
    requests = [SearchRequest(f"question {i}", PROMPT + [i], preset_config(preset, **options), f"r{i}")
                for i in range(n_requests)]
    results = runtime.run(requests)
    assert engine.num_live_sequences == 0 and all(r.error is None and r.paths for r in results)
    return runtime, verifier


def test_the_valve_counts_one_requests_beams_so_32_requests_lose_no_lookahead():
    """The old valve compared every request's sequences with 256: at N = 8 and 32 requests in flight
    most continuations were refused. Per request (8 running + 8 continuations) it never trips."""
    runtime, _ = run("fasttts", n_requests=32)
    searches = [s.search for s in runtime.finished.values()]
    assert not any(search.lookaheads_cut for search in searches)
    started = [e for search in searches for e in search.expansions.values() if e.started_as_lookahead]
    assert len(started) > 32 * 8  # about one per finished, continued step
    assert all(e.kept or e.cancelled for e in started)  # a refused one was left with no lane and not cancelled


def test_on_overflow_the_oldest_lookaheads_are_force_finished():
    runtime, _ = run("fasttts", n_requests=2, max_live_sequences=4)
    for state in runtime.finished.values():
        search = state.search
        assert search.lookaheads_cut == sorted(search.lookaheads_cut)  # oldest first
        assert all(search.expansions[i].started_as_lookahead for i in search.lookaheads_cut)
    assert any(state.search.lookaheads_cut for state in runtime.finished.values())


@pytest.mark.parametrize("preset", ["fasttts", "fasttts-xb"])
def test_every_other_retained_copy_starts_from_the_continuation(preset):
    """FastTTS gives every retained duplicate the continuation's text (truncated) as a head start; the
    old search gave it to one child only and started the others from scratch."""
    def shared_prefix(head_start):
        runtime, _ = run(preset, lookahead_head_start=head_start, lookahead_head_start_std=0.0)
        shared = started = 0
        for state in runtime.finished.values():
            search = state.search
            for e in search.expansions.values():
                if e.head_start_of is None or not e.finished:
                    continue
                source = search.expansions[e.head_start_of]
                if not source.finished:
                    continue
                started += 1
                a, b = e.finished[0].text, source.finished[0].text
                shared += next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert started > 0
        return shared / started

    assert shared_prefix(1.0) > shared_prefix(0.0) + 1.0


def test_fasttts_verifies_one_request_per_call_and_scores_continuations_with_their_round():
    _, fasttts = run("fasttts")
    _, crossed = run("fasttts-xb")
    assert all(len({q for q, _ in call}) == 1 for call in fasttts.calls)
    assert any(len({steps for _, steps in call}) > 1 for call in fasttts.calls)  # LookAhead in the same call
    assert any(len({q for q, _ in call}) > 1 for call in crossed.calls)  # fasttts-xb batches requests
    assert len(crossed.calls) < len(fasttts.calls)


def test_children_per_retained_parent_follow_dynamic_branching():
    runtime, _ = run("fasttts", n_requests=4)
    checked = 0
    for state in runtime.finished.values():
        search = state.search
        for rd in search.rounds:
            retained = [c for c in rd.candidates if c.state == CandidateState.RETAINED]
            if not retained:
                continue
            ranked = sorted(retained, key=lambda c: (-c.score, c.key))
            expected = children([c.score for c in ranked], 8)
            got = [sum(len(e.kept) for e in c.children if not e.cancelled) for c in ranked]
            assert got == expected
            checked += 1
    assert checked > 4
