"""The FastTTS baseline as FastTTS runs it (docs/design.md, "FastTTS"), on the scripted backend: children
spread uniformly in the headline presets and, in `fasttts-db`, dynamic branching on min-subtracted scores
(of the LookAhead step when it was scored with the round); the live-sequence valve per request
(force-finishing the oldest LookAhead continuations), a head start for every retained copy, and which
steps one PRM call verifies."""

import pytest

from scripted_generator import EOS, NEWLINE, ScriptedGenerator
from scripted_verifier import ScriptedVerifier
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.seam import KVUsage, ScoreResult
from specscale.search.branching import dynamic_children
from specscale.search.presets import preset_config
from specscale.search.seeds import node_seed
from specscale.search.selection import BeamSelection
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


def test_dynamic_branching_keeps_fasttts_epsilon_and_one_child_each_at_m_1():
    """FastTTS's weights are s - min + 1e-6 (its search/dynamic_branching.py): the weakest copy keeps a tiny
    weight, which decides near-ties; with as many copies as children it does not reallocate."""
    assert children([0.8, 0.7, 0.424, 0.14], 8) == [3, 3, 2, 0]  # without the 1e-6: 4 / 3 / 1 / 0
    assert children([1.0, 0.6, 0.0], 12) == [7, 5, 0]  # 8 / 4 / 0
    assert children([0.664806, 0.664804], 8) == [6, 2]  # a 2e-6 gap: 8 / 0
    assert children([0.9, 0.8, 0.7, 0.6], 4) == [1, 1, 1, 1]  # N = 4, M = 1: 2 / 1 / 1 / 0


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
    generator, verifier = ScriptedGenerator(clock), RecordingVerifier(clock)
    runtime = SearchRuntime(generator, verifier, clock=clock, max_concurrency=32,
                            device=DeviceProperties(40, None))
    options = dict(beam_size=8, beam_width=4, max_rounds=6, seed=7)
    options.update(overrides)
    requests = [SearchRequest(f"question {i}", PROMPT + [i], preset_config(preset, **options), f"r{i}")
                for i in range(n_requests)]
    results = runtime.run(requests)
    assert generator.num_live_sequences == 0 and all(r.error is None and r.paths for r in results)
    return runtime, verifier


def searches(runtime) -> list:
    return [runtime.search(rid) for rid in runtime.finished_ids()]


def test_the_valve_counts_one_requests_beams_so_32_requests_lose_no_lookahead():
    """The old valve compared every request's sequences with 256: at N = 8 and 32 requests in flight
    most continuations were refused. Per request (8 running + 8 continuations) it never trips."""
    runtime, _ = run("fasttts", n_requests=32)
    done = searches(runtime)
    assert not any(search.lookahead.cut for search in done)
    started = [e for search in done for e in search.expansions.values() if e.started_as_lookahead]
    assert len(started) > 32 * 8  # about one per finished, continued step
    assert all(e.kept or e.cancelled for e in started)  # a refused one was left with no lane and not cancelled


def test_on_overflow_the_oldest_lookaheads_are_force_finished():
    runtime, _ = run("fasttts", n_requests=2, max_live_sequences=4)
    for search in searches(runtime):
        assert search.lookahead.cut == sorted(search.lookahead.cut)  # oldest first
        assert all(search.expansions[i].started_as_lookahead for i in search.lookahead.cut)
    assert any(search.lookahead.cut for search in searches(runtime))


@pytest.mark.parametrize("preset", ["fasttts", "fasttts-xb"])
def test_every_other_retained_copy_starts_from_the_continuation(preset):
    """FastTTS gives every retained duplicate the continuation's text (truncated) as a head start; the
    old search gave it to one child only and started the others from scratch."""
    def shared_prefix(head_start):
        runtime, _ = run(preset, lookahead_head_start=head_start, lookahead_head_start_std=0.0)
        shared = started = 0
        for search in searches(runtime):
            for e in search.expansions.values():
                if e.start_from is None or not e.finished:
                    continue
                source = search.expansions[e.start_from.expansion_id]
                if not source.finished:
                    continue
                started += 1
                a, b = e.finished[0].text, source.finished[0].text
                shared += next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
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


def scored_lookahead_step(c) -> float | None:
    """The PRM's score of the last step of c's scored LookAhead continuation that ended at a step separator."""
    ahead = [a for e in c.children if e.started_as_lookahead and not e.cancelled for a in e.finished
             if a.state == CandidateState.SCORED and not a.completed]
    return ahead[0].step_scores[-1] if ahead else None


def test_children_per_retained_parent_follow_dynamic_branching_on_the_lookahead_step(monkeypatch):
    """FastTTS's code branches (next iteration) on the aggregate of a beam's whole score list, which holds
    its LookAhead step's score when that step was scored in the round's PRM call; the old search branched
    on the score the round was decided on."""
    weighed = []  # (retained candidates in rank order, the weights FastTTS would branch on)
    original = BeamSelection.children

    def recording(selection, retained):
        ranked = [c for c, _ in retained]
        ahead = [scored_lookahead_step(c) for c in ranked]
        weighed.append((ranked, [c.score if w is None else w for c, w in zip(ranked, ahead, strict=True)]))
        return original(selection, retained)

    monkeypatch.setattr(BeamSelection, "children", recording)
    run("fasttts-db", n_requests=16)
    assert len(weighed) > 16
    for ranked, weights in weighed:
        got = [sum(len(e.kept) for e in c.children if not e.cancelled) for c in ranked]
        assert got == children(weights, 8)
    assert sum(w != c.score for ranked, weights in weighed for c, w in zip(ranked, weights, strict=True)) > 4


# ---- a hand-made trace ------------------------------------------------------------------------------------
# One request, N = 4, M = 2 (k = 2), two rounds, the valve at 3 live beams. Round 0 writes steps of 2, 6, 3
# and 8 letters scored 0.9, 0.5, 0.7, 0.2; "aa" finishes first and its LookAhead continuation starts, then
# "ccc" finishes and starts its own: 2 real + 2 continuations exceed 3, so the oldest ("aa"'s) is cut.
SEED = 3
TEXTS = {(0,): "aa", (1,): "bbbbbb", (2,): "ccc", (3,): "dddddddd",
         (0, 0, 0): "ee", (2, 0, 0): "ff", (0, 0, 1): "gggg", (0, 0, 2): "hhhhh", (0, 0, 3): "iiiiii"}
SCORES = {"aa": 0.9, "bbbbbb": 0.5, "ccc": 0.7, "dddddddd": 0.2}
KEY_OF = {node_seed(SEED, (i,) + rest): (i,) + rest for i in range(4) for rest in [()] + [(0, j) for j in range(4)]}


def table_step(prefix: tuple, seed: int, final: bool) -> list[int]:
    letters = [ord(ch) - ord("a") for ch in TEXTS.get(KEY_OF[seed], "zz")]
    return letters + ([EOS] if final else [NEWLINE, NEWLINE])


class TableVerifier:
    """Scores each step by its text (0.3 when not in its table, SCORES by default); remembers each call's
    paths."""

    def __init__(self, clock, scores=SCORES):
        self.clock, self.calls, self.scores = clock, [], scores

    def score(self, requests):
        self.calls.append(sorted(tuple(s.strip() for s in r.steps) for r in requests))
        self.clock.advance(0.5)
        return [ScoreResult(tuple(self.scores.get(s.strip(), 0.3) for s in r.steps), len(r.steps)) for r in requests]

    def tokens_to_compute(self, request) -> int:
        return 1

    @property
    def kv_usage(self) -> KVUsage:
        return KVUsage(0, 1)


def test_a_hand_made_trace_gets_fasttts_decisions():
    clock = VirtualClock()
    verifier = TableVerifier(clock)
    runtime = SearchRuntime(ScriptedGenerator(clock, table_step), verifier, DeviceProperties(2048, None), clock=clock)
    config = preset_config("fasttts-db", beam_size=4, beam_width=2, max_rounds=2, seed=SEED, max_live_sequences=3)
    result = runtime.run([SearchRequest("q", [1, 2, 3], config, "r")])[0]
    search = runtime.search("r")
    by_keys = {e.child_keys[0]: e for e in search.expansions.values()}
    # selection: the top k = 2 of round 0; dynamic branching on 0.9 - 0.7 and 0.7 - 0.7 gives 4 and 0 children
    assert search.decisions[0].retained == ((("aa\n\n",), 1), (("ccc\n\n",), 1))
    assert [key for key, e in by_keys.items() if len(key) == 3 and not e.cancelled] == [(0, 0, 0), (0, 0, 1),
                                                                                       (0, 0, 2), (0, 0, 3)]
    assert by_keys[(2, 0, 0)].cancelled  # "ccc"'s continuation: its parent got no child
    # the valve cut "aa"'s continuation, the oldest running one, when "ccc"'s started
    assert search.lookahead.cut == [by_keys[(0, 0, 0)].id]
    # the cut continuation became "aa"'s first child; the other three start from its text
    assert {by_keys[(0, 0, j)].start_from.expansion_id for j in (1, 2, 3)} == {by_keys[(0, 0, 0)].id}
    # one PRM call per round of this request; "ccc"'s finished continuation is verified with round 0
    assert verifier.calls == [[("aa",), ("bbbbbb",), ("ccc",), ("ccc", "ff"), ("dddddddd",)],
                              [("aa", "ee"), ("aa", "gggg"), ("aa", "hhhhh"), ("aa", "iiiiii")]]
    assert sorted(p.text for p in result.paths) == ["aa\n\nee", "aa\n\ngggg", "aa\n\nhhhhh", "aa\n\niiiiii"]


# ---- a second hand-made trace: which score branches ------------------------------------------------------
# Same round 0 (N = 4, M = 2), three rounds, no valve: "aa" (0.9) and "ccc" (0.7) are retained, and both of
# their LookAhead continuations finish before "dddddddd" does, so the round's PRM call scores them too:
# "aa" + "ee" ends on 0.2, "ccc" + "ff" on 0.95. FastTTS prunes on the round's scores but branches on the
# LookAhead ones, so "ccc" gets the 4 children; branching on the decided scores gives them all to "aa".
AHEAD_TEXTS = {(0,): "aa", (1,): "bbbbbb", (2,): "ccc", (3,): "dddddddd", (0, 0, 0): "ee", (2, 0, 0): "ff"}
AHEAD_SCORES = {"aa": 0.9, "bbbbbb": 0.5, "ccc": 0.7, "dddddddd": 0.2, "ee": 0.2, "ff": 0.95}
AHEAD_KEYS = [(i,) + rest for i in range(4)
              for rest in [()] + [(0, j) for j in range(4)] + [(0, j, 0, m) for j in range(4) for m in range(4)]]
AHEAD_KEY_OF = {node_seed(SEED, key): key for key in AHEAD_KEYS}


def ahead_step(prefix: tuple, seed: int, final: bool) -> list[int]:
    letters = [ord(ch) - ord("a") for ch in AHEAD_TEXTS.get(AHEAD_KEY_OF.get(seed), "zz")]
    return letters + ([EOS] if final else [NEWLINE, NEWLINE])


@pytest.mark.parametrize("branching_score, children_of", [("lookahead", 2), ("decided", 0)])
def test_a_hand_made_trace_branches_on_the_lookahead_step(branching_score, children_of):
    clock = VirtualClock()
    verifier = TableVerifier(clock, AHEAD_SCORES)
    runtime = SearchRuntime(ScriptedGenerator(clock, ahead_step), verifier, DeviceProperties(2048, None), clock=clock)
    config = preset_config("fasttts-db", beam_size=4, beam_width=2, max_rounds=3, seed=SEED,
                           branching_score=branching_score)
    result = runtime.run([SearchRequest("q", [1, 2, 3], config, "r")])[0]
    search = runtime.search("r")
    by_keys = {e.child_keys[0]: e for e in search.expansions.values()}
    # pruning is on the round's own scores either way: "aa" then "ccc"
    assert search.decisions[0].retained == ((("aa\n\n",), 1), (("ccc\n\n",), 1))
    # both continuations were scored in round 0's PRM call
    assert verifier.calls[0] == [("aa",), ("aa", "ee"), ("bbbbbb",), ("ccc",), ("ccc", "ff"), ("dddddddd",)]
    round_1 = [key for key, e in by_keys.items() if len(key) == 3 and not e.cancelled]
    assert round_1 == [(children_of, 0, j) for j in range(4)]
    assert all(p.text.startswith("aa" if children_of == 0 else "ccc") for p in result.paths)


def test_the_dynamic_branching_preset_branches_on_the_lookahead_step_and_the_field_is_checked():
    assert preset_config("fasttts-db").branching_score == "lookahead"
    assert preset_config("beam", dynamic_branching=True).branching_score == "decided"
    with pytest.raises(ValueError, match="branching_score"):
        preset_config("fasttts-db", branching_score="next")


@pytest.mark.parametrize("preset", ["fasttts", "fasttts-xb"])
def test_fasttts_headline_presets_spread_children_uniformly(preset, monkeypatch):
    """FastTTS's headline runs (its artifact's `spec_prefix` configurations) are `beam_search`: each of the
    k = N / M retained paths gets M children whatever the scores; dynamic branching is `fasttts-db` only.
    The old presets gave all 8 children to the better of two retained paths whenever their scores differed."""
    spread = []  # (copies of each retained path, children it got)
    original = BeamSelection.children

    def recording(selection, retained):
        got = original(selection, retained)
        spread.extend((copies, n) for (_, copies), n in zip(retained, got, strict=True))
        return got

    monkeypatch.setattr(BeamSelection, "children", recording)
    run(preset, n_requests=8)
    assert len(spread) > 16 and all(n == 4 * copies for copies, n in spread)
