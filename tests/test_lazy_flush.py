"""The adaptive lazy-verification flush policy (runtime/lazy_flush.py) against the fixed triggers: when each
flushes, step by step in the verify queue, and what that does to a whole run on the scripted backends."""

from dataclasses import replace

import pytest

from scripted_generator import ScriptedGenerator
from scripted_verifier import ScriptedVerifier
from specscale.config import SearchConfig
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.lazy_flush import AdaptiveBudget, FixedTriggers, FlushSignals, flush_policy
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.runtime.verify_queue import AT_ONCE, LAZY, QueuedStep, VerifyQueue
from specscale.search.presets import preset_config
from specscale.sim.clock import VirtualClock

THRESHOLD = 1000
FIXED = FixedTriggers(THRESHOLD, max_deferrals=6, max_age_s=2.0)
FIXED_OWN_STEPS = FixedTriggers(THRESHOLD, max_deferrals=6, max_age_s=2.0, rides_along=False, whole_queue=False)
ADAPTIVE = AdaptiveBudget(THRESHOLD, wait_budget_calls=2.0, speculative_budget_tokens=500.0, kv_budget=0.9)
CALM = FlushSignals(kv_used_share=0.1, prm_call_s=1.0, speculative_tokens={})


def queued(policy, tokens=10, group=False, now=0.0, request="r"):
    return QueuedStep(request, 0, None, group, LAZY, tokens, now, policy)


def first_flush(policy, signals: FlushSignals, times, tokens=10, deferral_per_time=True):
    """The first time in `times` at which one queued step flushes, and the trigger that held."""
    queue = VerifyQueue()
    queue.push(queued(policy, tokens))
    for now in times:
        if queue.ready_batch(now, lambda: signals):
            return now, next(iter(queue.flush_reasons))
        if deferral_per_time:
            queue.count_deferral()
    return None


# ---- the adaptive policy flushes where the fixed triggers wait ---------------------------------------------
def test_kv_pressure_flushes_adaptive_at_once_where_fixed_waits():
    full = replace(CALM, kv_used_share=0.9)  # (0.9 - 0.5) / (0.9 - 0.5) = one whole budget
    assert first_flush(ADAPTIVE, full, [0.0]) == (0.0, "budget")
    assert first_flush(FIXED, full, [0.0, 0.1, 0.2]) is None
    half = replace(CALM, kv_used_share=0.7)  # half a budget: not yet, with nothing else pressing
    assert first_flush(ADAPTIVE, half, [0.0]) is None


def test_speculative_work_riding_on_the_request_flushes_adaptive():
    riding = replace(CALM, speculative_tokens={id("r"): 500})  # the request's speculative rows hold 500 tokens
    assert first_flush(ADAPTIVE, riding, [0.0]) == (0.0, "budget")
    other = replace(CALM, speculative_tokens={id("another request"): 500})  # someone else's: no pressure here
    assert first_flush(ADAPTIVE, other, [0.0]) is None
    assert first_flush(FIXED, riding, [0.0, 0.1]) is None


def test_pressures_add_up():
    both = FlushSignals(kv_used_share=0.7, prm_call_s=1.0, speculative_tokens={id("r"): 250})  # 0.5 + 0.5
    assert first_flush(ADAPTIVE, both, [0.0]) == (0.0, "budget")


# ---- ... and waits where the fixed triggers flush -----------------------------------------------------------
def test_fixed_deferral_cap_fires_on_fast_ticks_where_adaptive_waits_for_its_time_budget():
    ticks = [0.01 * k for k in range(1000)]  # ticks of 10 ms, PRM calls of 1 s: 7 ticks are no wait at all
    assert first_flush(FIXED, CALM, ticks) == (pytest.approx(0.07), "deferrals")
    # adaptive: age / (2 calls x 1 s) >= 1 - 10 / 1000 once the step is 1.98 s old
    assert first_flush(ADAPTIVE, CALM, ticks) == (pytest.approx(1.98), "budget")


def test_a_fuller_batch_leaves_less_to_gain_from_waiting():
    ticks = [0.01 * k for k in range(1000)]
    assert first_flush(ADAPTIVE, CALM, ticks, tokens=500) == (pytest.approx(1.0), "budget")  # gain left 0.5
    assert first_flush(ADAPTIVE, CALM, [0.0], tokens=THRESHOLD) == (0.0, "tokens")


def test_no_wait_pressure_before_the_first_prm_call():
    unknown = replace(CALM, prm_call_s=None)
    assert first_flush(ADAPTIVE, unknown, [0.0, 100.0]) is None  # the generator-idle flush still drains it


def test_adaptive_keeps_the_sibling_group_trigger():
    queue = VerifyQueue()
    queue.push(queued(ADAPTIVE))
    queue.push(queued(ADAPTIVE, group=True))
    assert len(queue.ready_batch(0.0, lambda: CALM)) == 2 and queue.flush_reasons == {"sibling-group": 1}


def test_signals_are_read_once_per_tick_and_only_when_a_policy_needs_them():
    reads = []

    def signals():
        reads.append(1)
        return CALM

    queue = VerifyQueue()
    queue.push(queued(FIXED, request="a"))
    queue.ready_batch(0.0, signals)
    assert reads == []  # the fixed triggers never read them
    queue.push(queued(ADAPTIVE, request="b"))
    queue.push(queued(ADAPTIVE, request="c"))
    queue.ready_batch(0.0, signals)
    assert reads == [1]


def test_the_config_names_the_policy_and_the_preset_is_specscale_with_it():
    assert flush_policy(SearchConfig(), 64) == FixedTriggers(64, 6, 2.0)  # the whole queue, riding along
    assert flush_policy(SearchConfig(lv_policy="adaptive", lv_wait_budget_calls=3.0), 64) == AdaptiveBudget(
        64, 3.0, 512.0, 0.9)
    own = flush_policy(SearchConfig(lv_flush_scope="request"), 64)
    assert own == FixedTriggers(64, 6, 2.0, rides_along=False, whole_queue=False)
    assert flush_policy(SearchConfig(lv_flush_scope="request", lv_ride_along=True), 64).rides_along
    assert not flush_policy(SearchConfig(lv_policy="adaptive", lv_ride_along=False), 64).rides_along
    assert preset_config("specscale-adaptive") == replace(preset_config("specscale"), lv_policy="adaptive")
    with pytest.raises(ValueError, match="lv_policy"):
        SearchConfig(lv_policy="sometimes")


# ---- whole runs on the scripted backends --------------------------------------------------------------------
def scripted_run(preset: str, num_blocks: int = 1000, **overrides) -> SearchRuntime:
    clock = VirtualClock()
    runtime = SearchRuntime(ScriptedGenerator(clock, num_blocks=num_blocks), ScriptedVerifier(clock), clock=clock,
                            device=DeviceProperties(10**6, None))
    config = preset_config(preset, beam_size=8, beam_width=4, max_rounds=5, seed=3, **overrides)
    runtime.run([SearchRequest(f"q{i}", [1, 2, 3, i], config) for i in range(6)])
    assert runtime.stats().live_sequences == 0
    return runtime


def test_under_kv_pressure_adaptive_flushes_on_its_budget_and_fixed_never_does():
    fixed = scripted_run("specscale", num_blocks=60)
    adaptive = scripted_run("specscale-adaptive", num_blocks=60)
    assert "budget" in adaptive.flush_reasons and adaptive.flush_reasons["budget"] > 0
    assert set(fixed.flush_reasons) <= {"sibling-group", "idle", "deferrals", "age"}


def test_where_the_fixed_deferral_cap_flushes_every_tick_adaptive_batches_by_sibling_group():
    fixed = scripted_run("specscale", lv_max_deferrals=0)
    adaptive = scripted_run("specscale-adaptive", lv_max_deferrals=0)  # the cap is not one of its triggers
    assert fixed.flush_reasons.get("deferrals", 0) > 0 and "deferrals" not in adaptive.flush_reasons
    assert len(adaptive.verifier.batches) < len(fixed.verifier.batches)


def test_adaptive_steps_ride_along_with_a_prm_batch_that_runs_anyway_and_request_scope_fixed_ones_wait():
    queue = VerifyQueue()
    queue.push(queued(ADAPTIVE, request="adaptive"))
    queue.push(queued(FIXED_OWN_STEPS, request="fixed"))
    queue.push(QueuedStep("eager", 1, None, False, AT_ONCE, 5, 0.0, None))
    assert [i.request for i in queue.ready_batch(0.0, lambda: CALM)] == ["eager", "adaptive"]
    assert queue.flush_reasons == {"ride-along": 1} and [i.request for i in queue.items] == ["fixed"]
    queue.push(queued(ADAPTIVE, request="adaptive"))
    queue.push(queued(FIXED_OWN_STEPS, group=True, request="another fixed"))  # its group completes: it flushes
    assert [i.request for i in queue.ready_batch(0.0, lambda: CALM)] == ["another fixed", "adaptive"]
    assert [i.request for i in queue.items] == ["fixed"]
