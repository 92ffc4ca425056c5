"""Partial-step rejection (docs/design.md, "Partial-step rejection"; search/partial_rejection.py): its decisions on
hand-made traces fed to a search, its stops carried out on the scripted backend (the sequence aborted before it
finishes its step, every block freed), "off" changing nothing, and one run on the bundled toy models."""

import statistics
from dataclasses import replace

import pytest

from search_backends import SMALL, scripted_request, scripted_runtime
from specscale.config import SearchConfig
from specscale.seam import SequenceState
from specscale.search.partial_rejection import kth_best
from specscale.search.presets import preset_config
from specscale.search.protocol import Cancel, Expand, ScoresArrived, StepFinished, StepPartial, Verify
from specscale.search.search import Search
from specscale.sim.synthetic_prm import SyntheticPRM
from specscale.sim.tokenizer import SyntheticTokenizer
from specscale.sim.workload import preset

K2 = dict(beam_size=4, beam_width=2, max_rounds=3, seed=0)  # k = 2 retained


def started(**fields) -> tuple[Search, list[int]]:
    """A search of beam_size 4 (k = 2) with partial rejection at 4 tokens, and its round-0 expansion ids."""
    config = preset_config("beam", **{**K2, "partial_rejection": "kth", "partial_tokens": 4, **fields})
    search = Search(config)
    return search, [a.expansion_id for a in search.start(0.0) if isinstance(a, Expand)]


def finish(search: Search, expansion: int, handle: int, score: float, time: float) -> list:
    """Expansion `expansion` finishes its one-lane step and the PRM scores it."""
    actions = search.on(StepFinished(expansion, handle, f"step {expansion}\n\n", 6, (0,), False, time))
    candidate = search.expansions[expansion].finished[-1].id
    return actions + search.on(ScoresArrived(candidate, (score,), None, time))


def partial(search: Search, expansion: int, handle: int, score: float, time: float,
            lanes: tuple[int, ...] = (0,)) -> list:
    """Expansion `expansion`'s sequence `handle` reaches 4 tokens; its partial readout is sent and scored."""
    sent = search.on(StepPartial(expansion, handle, f"part {expansion}", 4, lanes, time))
    (verify,) = [a for a in sent if isinstance(a, Verify)]
    assert not verify.completes_group and verify.steps[-1] == f"part {expansion}"
    return search.on(ScoresArrived(verify.candidate, (score,), None, time))


def stopped(actions: list) -> tuple[set[int], set[int]]:
    """The expansions and sequence handles these actions cancel."""
    cancels = [a for a in actions if isinstance(a, Cancel)]
    return {e for a in cancels for e in a.expansions}, {h for a in cancels for h in a.handles}


def test_a_running_step_below_the_kth_verified_score_by_the_margin_is_stopped_one_above_is_kept():
    search, (e0, e1, e2, e3) = started(partial_margin=0.1)
    finish(search, e0, 100, 0.9, 1.0)
    finish(search, e1, 101, 0.8, 1.0)  # the k-th (2nd) best verified: 0.8, the bar 0.7
    below = partial(search, e2, 102, 0.65, 2.0)
    assert stopped(below) == ({e2}, set())
    assert search.expansions[e2].cancelled and search.partial.rejected_copies == 1
    above = partial(search, e3, 103, 0.75, 2.0)
    assert stopped(above) == (set(), set()) and search.expansions[e3].live
    finish(search, e3, 103, 0.5, 3.0)  # the round decides without the stopped step
    (decision,) = search.decisions
    assert [steps[-1] for steps, _ in decision.retained] == [f"step {e0}\n\n", f"step {e1}\n\n"]


def test_with_no_verified_score_the_decision_waits_for_more_than_k_partials():
    search, (e0, e1, e2, _) = started(partial_margin=0.0)
    assert stopped(partial(search, e0, 100, 0.1, 1.0)) == (set(), set())
    assert stopped(partial(search, e1, 101, 0.2, 1.0)) == (set(), set())  # k = 2 partials: not more than k
    third = partial(search, e2, 102, 0.9, 1.0)  # 3 > k: the bar is the 2nd best partial, 0.2
    assert stopped(third) == ({e0}, set())
    assert search.expansions[e1].live and search.expansions[e2].live


def test_a_verified_score_arriving_later_stops_a_step_already_read():
    search, (e0, e1, e2, _) = started(partial_margin=0.1)
    assert stopped(partial(search, e2, 102, 0.5, 1.0)) == (set(), set())
    finish(search, e0, 100, 0.9, 2.0)
    assert stopped(finish(search, e1, 101, 0.8, 2.0)) == ({e2}, set())


def test_a_step_that_finished_before_its_readout_was_scored_is_neither_judged_nor_scored():
    search, (e0, e1, e2, _) = started(partial_margin=0.0)
    finish(search, e0, 100, 0.9, 1.0)
    finish(search, e1, 101, 0.8, 1.0)
    (verify,) = search.on(StepPartial(e2, 102, "part", 4, (0,), 2.0))
    done = search.on(StepFinished(e2, 102, "part of it\n\n", 6, (0,), False, 3.0))
    assert Cancel(candidates=(verify.candidate,)) in done  # its queued readout is dropped
    assert search.on(ScoresArrived(verify.candidate, (0.0,), None, 3.0)) == []
    assert search.expansions[e2].finished and search.partial.rejected_copies == 0


def test_with_cd_a_split_row_is_stopped_alone_and_its_siblings_run_on():
    config = preset_config("beam+cd", **{**K2, "partial_rejection": "kth", "partial_tokens": 4, "partial_margin": 0.0})
    search = Search(config)
    (expand,) = [a for a in search.start(0.0) if isinstance(a, Expand)]  # one row of multiplicity 4
    e = expand.expansion_id
    partial(search, e, 7, 0.9, 1.0, lanes=(0,))
    partial(search, e, 8, 0.8, 1.0, lanes=(1,))
    low = partial(search, e, 9, 0.1, 1.0, lanes=(2, 3))  # 4 copies > k: the bar is 0.8
    assert stopped(low) == (set(), {9})  # only the row holding lanes 2 and 3
    assert search.expansions[e].kept == {0, 1} and search.expansions[e].live
    assert search.partial.rejected_copies == 2


def test_a_speculative_round_is_not_judged_before_its_parents_are_decided():
    config = preset_config("ep", **{**K2, "partial_rejection": "kth", "partial_tokens": 4, "partial_margin": 0.0})
    search = Search(config)
    ids = [a.expansion_id for a in search.start(0.0) if isinstance(a, Expand)]
    actions = finish(search, ids[0], 100, 0.9, 1.0)  # eager speculation expands it at once
    children = [a.expansion_id for a in actions if isinstance(a, Expand)]
    assert children and all(search.expansions[c].round == 1 for c in children)
    for n, child in enumerate(children[:3]):
        assert stopped(partial(search, child, 200 + n, 0.1 * (n + 1), 2.0)) == (set(), set())


def test_kth_best_counts_copies():
    assert kth_best([(0.9, 1), (0.5, 2), (0.7, 1)], 3) == 0.5
    assert kth_best([(0.9, 1), (0.5, 2)], 4) is None


@pytest.mark.parametrize("fields,message", [({"partial_rejection": "maybe"}, "partial_rejection must be one of"),
                                            ({"partial_tokens": 0}, "partial_tokens"),
                                            ({"partial_margin": -0.1}, "partial_margin")])
def test_bad_fields_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Search(SearchConfig(**fields))


def run_scripted(variant: str, problems: int = 6):
    runtime = scripted_runtime(max_concurrency=4)
    requests = [scripted_request(i, preset_config(variant, seed=i, beam_size=8, beam_width=2, max_rounds=6,
                                                  max_step_tokens=48), f"r{i}") for i in range(problems)]
    results = runtime.run(requests)
    return runtime, results, [runtime.search(f"r{i}") for i in range(problems)]


def test_off_changes_nothing_on_the_scripted_backend():
    _, base, _ = run_scripted("specscale")
    _, off, searches = run_scripted("specscale[partial_rejection=off,partial_tokens=3]")
    assert off == base and all(s.partial.rejected_copies == 0 for s in searches)


def test_stopped_sequences_never_finish_their_step_and_every_block_is_freed(monkeypatch):
    stopped_handles: list[int] = []
    stop_lanes = Search.stop_lanes

    def recording(self, e, lanes, handle, time):
        stopped_handles.append(handle)
        return stop_lanes(self, e, lanes, handle, time)

    monkeypatch.setattr(Search, "stop_lanes", recording)
    runtime = scripted_runtime(max_concurrency=4)
    finished: set[int] = set()
    step = runtime.generator.step

    def watched_step():
        updates = step()
        finished.update(u.seq_id for u in updates if u.state != SequenceState.GENERATING)
        return updates

    runtime.generator.step = watched_step
    variant = "specscale+reject[partial_tokens=3,partial_margin=0.0]"
    requests = [scripted_request(i, preset_config(variant, seed=i, beam_size=8, beam_width=2, max_rounds=6,
                                                  max_step_tokens=48), f"r{i}") for i in range(6)]
    results = runtime.run(requests)
    assert len(stopped_handles) >= 10 and all(r.paths for r in results)
    assert not finished & set(stopped_handles)  # each was aborted mid-step
    assert runtime.generator.num_live_sequences == 0 and not runtime.sequences.physical
    assert not runtime.queue.items


def test_the_preset_runs_on_the_bundled_toy_models(toy_search_backend):
    runtime = toy_search_backend.runtime(max_concurrency=2)
    config = preset_config("specscale+reject", **{**SMALL, "partial_tokens": 4, "partial_margin": 0.0}, seed=1)
    requests = [toy_search_backend.request(i, config, f"t{i}") for i in range(2)]
    results = runtime.run(requests)
    assert all(r.paths and r.error is None for r in results)
    assert runtime.generator.num_live_sequences == 0
    toy_search_backend.release()


def readout_pairs(rho: float, steps: int = 400) -> list[tuple[float, float]]:
    """The simulated PRM's readouts after 2 words and after 8 words of many sound steps (one opener each)."""
    workload = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b")
    params = replace(workload.prm, partial_correlation=rho)
    tokenizer = SyntheticTokenizer("chatml")
    prm = SyntheticPRM(params, tokenizer, "qwen-math-prm", seed=0)
    pairs = []
    for i in range(steps):
        words = [tokenizer.words[(i * 7 + j * 13) % len(tokenizer.words)] for j in range(8)]
        step = [tokenizer.question_ids[i % 200], tokenizer.good_openers[i % 8], *words]
        pairs.append((prm.score(step[:4], 3), prm.score(step, len(step) - 1)))
    return pairs


def test_the_simulated_prm_correlates_a_steps_readouts_by_partial_correlation_and_not_by_default():
    def within(pairs):
        below = [(a, b) for a, b in pairs if a < 1.0 and b < 1.0]
        return statistics.correlation([a for a, _ in below], [b for _, b in below])

    assert abs(within(readout_pairs(0.0))) < 0.15
    assert 0.45 < within(readout_pairs(0.6)) < 0.75
    params = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b").prm
    for u in ((0.5, 0.3), (0.9, 0.01), (0.1, 0.99)):  # rho = 0 is exactly the default model
        assert params.readout_score(False, u, (0.2, 0.7), 0.4) == params.score(False, *u)
