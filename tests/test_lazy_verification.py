"""Each lazy-verification trigger fires alone: token threshold, sibling group, deferral cap, age cap;
plus the flush policy for eager and per-request (FastTTS) steps, and the runtime's use of them."""

from scripted_generator import ScriptedGenerator
from scripted_verifier import ScriptedVerifier
from specscale.runtime.device_properties import DeviceProperties
from specscale.runtime.lazy_flush import FixedTriggers
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.runtime.verify_queue import AT_ONCE, LAZY, ONE_REQUEST, QueuedStep, VerifyQueue
from specscale.search.presets import preset_config
from specscale.sim.clock import VirtualClock

NEVER = 10**9


def lazy(tokens=10, group=False, now=0.0, threshold=NEVER, deferrals=NEVER, age=float(NEVER), request="r"):
    return QueuedStep(request, 0, None, group, LAZY, tokens, now, FixedTriggers(threshold, deferrals, age))


def test_token_threshold_trigger_alone():
    queue = VerifyQueue()
    queue.push(lazy(tokens=30, threshold=64))
    queue.push(lazy(tokens=30, threshold=64))
    assert queue.ready_batch(now=0.0) == []
    queue.push(lazy(tokens=4, threshold=64))
    assert len(queue.ready_batch(now=0.0)) == 3 and queue.flush_reasons == {"tokens": 1}


def test_sibling_group_trigger_alone():
    queue = VerifyQueue()
    queue.push(lazy())
    assert queue.ready_batch(now=0.0) == []
    queue.push(lazy(group=True))
    assert len(queue.ready_batch(now=0.0)) == 2 and queue.flush_reasons == {"sibling-group": 1}


def test_deferral_cap_trigger_alone():
    queue = VerifyQueue()
    queue.push(lazy(deferrals=6))
    for _ in range(7):  # deferred 0..6 times: not more than the cap of 6 yet
        assert queue.ready_batch(now=0.0) == []
        queue.count_deferral()
    assert len(queue.ready_batch(now=0.0)) == 1 and queue.flush_reasons == {"deferrals": 1}


def test_age_cap_trigger_alone():
    queue = VerifyQueue()
    queue.push(lazy(now=10.0, age=0.5))
    assert queue.ready_batch(now=10.4) == []
    assert len(queue.ready_batch(now=10.6)) == 1 and queue.flush_reasons == {"age": 1}


def test_eager_steps_batch_across_requests_and_fasttts_steps_per_request():
    queue = VerifyQueue()
    queue.push(QueuedStep("a", 0, None, False, AT_ONCE, 5, 0.0, None))
    queue.push(QueuedStep("b", 1, None, False, AT_ONCE, 5, 0.0, None))
    queue.push(lazy(request="c"))
    assert [i.request for i in queue.ready_batch(0.0)] == ["a", "b", "c"]  # lazy rides along
    queue.push(lazy(request="c"))
    queue.push(QueuedStep("d", 2, None, True, ONE_REQUEST, 5, 0.0, None))
    queue.push(QueuedStep("e", 3, None, True, ONE_REQUEST, 5, 0.0, None))
    queue.push(QueuedStep("d", 4, None, True, ONE_REQUEST, 5, 0.0, None))
    assert [i.candidate for i in queue.ready_batch(0.0)] == [2, 4]  # one request per PRM call
    assert [i.candidate for i in queue.ready_batch(0.0)] == [3]
    assert [i.request for i in queue.any_batch()] == ["c"]  # generator idle: flush the rest


def test_specscale_runtime_flushes_lazily_with_bigger_batches():
    sizes = {}
    for preset in ("ep+cd", "specscale"):
        clock = VirtualClock()
        runtime = SearchRuntime(ScriptedGenerator(clock), ScriptedVerifier(clock), clock=clock,
                                device=DeviceProperties(60, None))
        config = preset_config(preset, beam_size=8, beam_width=4, max_rounds=6, seed=5)
        runtime.run([SearchRequest(f"q{i}", [1, 2, 3, i], config) for i in range(6)])
        sizes[preset] = sum(runtime.verifier.batches) / len(runtime.verifier.batches)
        assert runtime.stats().live_sequences == 0
    assert sizes["specscale"] > 1.25 * sizes["ep+cd"]  # fewer, bigger PRM calls


def test_one_threshold_for_the_queue_flushes_every_request_at_once():
    """The threshold is the verifier's: 60 tokens queued by two requests flush both (test_lazy_queue.py has
    the other triggers across requests)."""
    queue = VerifyQueue()
    queue.push(lazy(tokens=30, threshold=50, request="a"))
    queue.push(lazy(tokens=30, threshold=50, request="b"))
    assert [i.request for i in queue.ready_batch(now=0.0)] == ["a", "b"] and queue.items == []
