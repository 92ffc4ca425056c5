"""Lazy verification flushes the verifier's whole queue (docs/design.md, "Verification"): any trigger scores
every queued lazy step of every request in one PRM call, at the verifier's threshold; the per-request flush
is an ablation. Also the search's own sibling-group signal, which the queue's trigger tests take on trust."""

from dataclasses import replace

from scripted_generator import ScriptedGenerator
from scripted_verifier import ScriptedVerifier
from specscale.config import SearchConfig
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.lazy_flush import FixedTriggers, flush_policy
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.runtime.verify_queue import AT_ONCE, LAZY, QueuedStep, VerifyQueue
from specscale.search.presets import preset_config
from specscale.search.protocol import Expand, ScoresArrived, StepFinished, Verify
from specscale.search.search import Search
from specscale.sim.clock import VirtualClock
from specscale.sim.simulation import Simulation, SimulationConfig

NEVER = 10**9
QUEUE = FixedTriggers(NEVER, NEVER, float(NEVER))
OWN_STEPS = replace(QUEUE, rides_along=False, whole_queue=False)


def lazy(request, candidate=0, tokens=10, group=False, policy=QUEUE):
    return QueuedStep(request, candidate, None, group, LAZY, tokens, 0.0, policy)


def test_a_sibling_trigger_of_one_request_scores_every_requests_queued_steps():
    queue = VerifyQueue()
    queue.push(lazy("b", 1))
    queue.push(lazy("c", 2))
    assert queue.ready_batch(0.0) == []
    queue.push(lazy("a", 3, group=True))
    assert [i.request for i in queue.ready_batch(0.0)] == ["b", "c", "a"]
    assert queue.items == [] and queue.flush_reasons == {"sibling-group": 1}


def test_the_threshold_counts_every_requests_tokens_and_flushes_them_all():
    policy = replace(QUEUE, threshold_tokens=50)
    queue = VerifyQueue()
    for request in "abcd":
        queue.push(lazy(request, tokens=12, policy=policy))
    assert queue.ready_batch(0.0) == []
    queue.push(lazy("e", tokens=2, policy=policy))  # 50 tokens queued across five requests
    assert len(queue.ready_batch(0.0)) == 5 and queue.flush_reasons == {"tokens": 1}


def test_the_deferral_cap_of_one_step_flushes_the_whole_queue():
    queue = VerifyQueue()
    queue.push(lazy("old", policy=replace(QUEUE, max_deferrals=1)))
    queue.count_deferral()
    queue.push(lazy("new"))
    queue.count_deferral()  # "old" deferred twice: past its cap
    assert [i.request for i in queue.ready_batch(0.0)] == ["old", "new"]
    assert queue.flush_reasons == {"deferrals": 1}


def test_lazy_steps_ride_along_with_a_prm_call_that_runs_anyway():
    queue = VerifyQueue()
    queue.push(lazy("lazy"))
    queue.push(QueuedStep("eager", 1, None, False, AT_ONCE, 5, 0.0, None))
    assert [i.request for i in queue.ready_batch(0.0)] == ["eager", "lazy"]
    assert queue.flush_reasons == {"ride-along": 1}


def test_the_request_scope_ablation_flushes_the_triggering_requests_steps_only():
    queue = VerifyQueue()
    queue.push(lazy("b", policy=OWN_STEPS))
    queue.push(lazy("a", group=True, policy=OWN_STEPS))
    assert [i.request for i in queue.ready_batch(0.0)] == ["a"]
    assert [i.request for i in queue.items] == ["b"]


def test_a_request_cannot_set_the_threshold():
    assert not hasattr(SearchConfig(), "lv_threshold_tokens")
    assert flush_policy(preset_config("specscale"), 777).threshold_tokens == 777
    assert flush_policy(preset_config("specscale"), 777).whole_queue
    assert not flush_policy(preset_config("specscale", lv_flush_scope="request"), 777).whole_queue


# ---- the search's sibling-group signal ---------------------------------------------------------------------
def finish(search: Search, expand: Expand, handle: int, time: float) -> list:
    return search.on(StepFinished(expand.expansion_id, handle, "step", 3, tuple(range(expand.multiplicity)),
                                  False, time))


def group_flags(preset: str) -> list[bool]:
    """completes_group of each Verify as round 0's children finish one by one."""
    search = Search(preset_config(preset, beam_size=8, beam_width=4, seed=1))
    expands = [a for a in search.start(0.0) if isinstance(a, Expand)]
    flags = []
    for handle, expand in enumerate(expands):
        flags += [a.completes_group for a in finish(search, expand, 100 + handle, float(handle)) if isinstance(a, Verify)]
    return flags


def test_only_the_last_sibling_to_finish_completes_the_group():
    assert group_flags("naive-spec") == [False] * 7 + [True]  # round 0: the prompt's eight children


def test_a_cd_expansion_completes_its_group_when_its_one_row_finishes():
    assert group_flags("specscale") == [True]  # one expansion of multiplicity 8


# ---- whole runs on the scripted backends ------------------------------------------------------------------
def scripted_run(preset: str, threshold: int = 60, beam_width: int = 4, **overrides) -> SearchRuntime:
    clock = VirtualClock()
    runtime = SearchRuntime(ScriptedGenerator(clock), ScriptedVerifier(clock), clock=clock,
                            device=DeviceProperties(threshold, None))
    config = preset_config(preset, beam_size=8, beam_width=beam_width, max_rounds=6, seed=5, **overrides)
    runtime.run([SearchRequest(f"q{i}", [1, 2, 3, i], config) for i in range(8)])
    assert runtime.stats().live_sequences == 0
    return runtime


def requests_per_call(runtime: SearchRuntime) -> list[int]:
    return runtime.metrics.verifier_batch_requests


def test_specscale_makes_no_more_prm_calls_than_ep_cd_on_the_same_trace():
    ep_cd, specscale = scripted_run("ep+cd"), scripted_run("specscale")
    assert len(specscale.verifier.batches) <= len(ep_cd.verifier.batches)


def test_the_whole_queue_flush_makes_fewer_calls_holding_more_requests_than_the_per_request_ablation():
    whole = scripted_run("specscale", threshold=NEVER)
    own = scripted_run("specscale", threshold=NEVER, lv_flush_scope="request")
    assert len(whole.verifier.batches) < len(own.verifier.batches)
    assert max(requests_per_call(whole)) > 1
    assert sum(requests_per_call(whole)) / len(requests_per_call(whole)) > \
        sum(requests_per_call(own)) / len(requests_per_call(own))


def test_the_no_speculation_control_batches_across_requests_and_keeps_beam_cds_paths():
    control, beam_cd = scripted_run("beam+cd+lv"), scripted_run("beam+cd")
    paths = [[p.text for p in control.result(i).paths] for i in control.finished_ids()]
    assert paths == [[p.text for p in beam_cd.result(i).paths] for i in beam_cd.finished_ids()]
    assert control.flush_reasons.get("sibling-group")  # the fixed triggers, the sibling group's among them
    assert max(requests_per_call(control)) > 1


def test_the_all_but_speculation_control_is_specscale_with_speculation_off():
    control, specscale = preset_config("specscale-nospec"), preset_config("specscale")
    assert control == replace(specscale, speculation="none")
    run = scripted_run("specscale-nospec")
    assert all(r.usage.wasted_tokens == 0 for r in map(run.result, run.finished_ids()))  # nothing speculative


def test_a_round_queued_whole_is_a_set_of_complete_sibling_groups():
    search = Search(preset_config("beam+cd", verification="lazy_round", beam_size=8, beam_width=4, seed=1))
    expand = next(a for a in search.start(0.0) if isinstance(a, Expand))
    verifies = [a for a in finish(search, expand, 100, 0.0) if isinstance(a, Verify)]
    assert verifies and all(v.completes_group for v in verifies)


def test_without_the_sibling_trigger_whole_rounds_wait_for_the_other_triggers():
    ablation = scripted_run("beam+cd[verification=lazy_round,lv_sibling_trigger=false]", threshold=NEVER)
    assert ablation.flush_reasons and "sibling-group" not in ablation.flush_reasons
    assert len(ablation.verifier.batches) < len(scripted_run("beam+cd").verifier.batches)


def test_the_sibling_trigger_switch_reaches_both_flush_policies():
    for policy in ("fixed", "adaptive"):
        config = preset_config("specscale", lv_policy=policy, lv_sibling_trigger=False)
        assert not flush_policy(config, 100).group_completed([lazy("a", group=True)])
        assert flush_policy(replace(config, lv_sibling_trigger=True), 100).group_completed([lazy("a", group=True)])


# ---- the group: the round (`lv_group = "round"`, the default) or the sibling group ---------------------------------------------------
def round_flags(lv_group: str) -> list[bool]:
    """completes_group of each Verify of round 1 (two parents, four children each, one lane per child) as its
    children finish one by one, after round 0 was scored and decided."""
    search = Search(preset_config("naive-spec", speculation="none", beam_size=8, beam_width=4, seed=1,
                                  lv_group=lv_group))
    handles = iter(range(100, 1000))
    for expand in [a for a in search.start(0.0) if isinstance(a, Expand)]:
        finish(search, expand, next(handles), 0.0)
    actions = []
    for c in search.rounds[0].candidates:
        actions += search.on(ScoresArrived(c.id, (0.5 + 0.01 * c.id,), None, 1.0))
    expands = [a for a in actions if isinstance(a, Expand)]
    assert len({e.parent_handle for e in expands}) == 2 and len(expands) == 8
    return [v.completes_group for e in expands for v in finish(search, e, next(handles), 2.0) if isinstance(v, Verify)]


def test_the_round_group_completes_once_a_round_where_sibling_groups_complete_once_a_parent():
    siblings = round_flags("siblings")
    assert len(siblings) == 8 and sum(siblings) == 2 and siblings[-1]
    assert round_flags("round") == [False] * 7 + [True]


def test_the_round_group_flushes_less_often_with_n_above_m_and_changes_nothing_with_n_equal_m():
    siblings = scripted_run("specscale-nospec", threshold=NEVER, lv_group="siblings")
    rounds = scripted_run("specscale-nospec", threshold=NEVER)
    assert preset_config("specscale").lv_group == preset_config("specscale-nospec").lv_group == "round"
    assert rounds.flush_reasons["sibling-group"] < siblings.flush_reasons["sibling-group"]
    assert len(rounds.verifier.batches) < len(siblings.verifier.batches)
    wide, wide_rounds = (scripted_run("specscale", threshold=NEVER, beam_width=8, lv_group=group)
                         for group in ("siblings", "round"))  # N = M: the round is the one sibling group
    assert wide.flush_reasons == wide_rounds.flush_reasons
    assert [[p.text for p in wide.result(i).paths] for i in wide.finished_ids()] == \
        [[p.text for p in wide_rounds.result(i).paths] for i in wide_rounds.finished_ids()]


# ---- the idle generator (SPEC 3.3 trigger 4) -----------------------------------------------------------------
def one_at_a_time(preset: str, spare_rows: int | None, problems: int = 2, **overrides) -> SearchRuntime:
    """Requests one at a time on the simulator's engine (the real scheduler and its row budget, virtual clock),
    with the lazy queue's token threshold out of reach."""
    sim = Simulation(SimulationConfig(seed=0, spare_rows=spare_rows, lv_threshold_tokens=NEVER))
    runtime = sim.runtime(max_concurrency=1)
    config = preset_config(preset, beam_size=8, beam_width=4, seed=5, **overrides)
    runtime.run([sim.request(p, config) for p in sim.problems(problems)])
    assert runtime.stats().live_sequences == 0
    return runtime


def test_an_idle_generator_flushes_at_once_even_with_speculative_rows_that_have_no_room():
    """With no speculative row budget, a request whose round has finished holds only speculative sequences the
    engine will not run: the queue flushes on that tick ("idle"), not after empty iterations count deferrals."""
    runtime = one_at_a_time("specscale", spare_rows=0, lv_sibling_trigger=False, lv_max_deferrals=20,
                            lv_max_age_s=float(NEVER))
    assert runtime.flush_reasons.get("idle", 0) > 0


def test_one_request_with_only_the_idle_trigger_makes_no_more_prm_calls_than_rounds():
    """One request in flight, the other triggers out of reach: at most one flush per round, as `beam` makes one
    PRM call per round, with and without room for speculation."""
    beam = one_at_a_time("beam", spare_rows=0)
    assert prm_calls(beam) == rounds(beam)
    for spare_rows in (0, None):
        lazy = one_at_a_time("specscale", spare_rows, lv_sibling_trigger=False, lv_max_deferrals=NEVER,
                             lv_max_age_s=float(NEVER))
        assert set(lazy.flush_reasons) == {"idle"}
        assert prm_calls(lazy) <= rounds(lazy)


def rounds(runtime: SearchRuntime) -> int:
    return sum(len(runtime.search(i).rounds) for i in runtime.finished_ids())


def prm_calls(runtime: SearchRuntime) -> int:
    return len(runtime.metrics.verifier_batch_requests)
