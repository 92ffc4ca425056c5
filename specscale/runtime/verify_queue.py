"""Queued verifications and the policy deciding which of them make up the next PRM batch. Each step
carries its verification policy's `Batching` (the queue's side of `search/verification.py`), whose hooks
the queue calls:

- `AT_ONCE` ("round" and "immediate" policies) steps are ready at once (a request's whole round, or each step as it
  finishes), batched across requests;
- `LAZY` steps (lazy verification, docs/design.md) wait in the verifier's one lazy queue until a trigger
  holds (`runtime/lazy_flush.py`: the fixed triggers of the verifier's token threshold over every queued
  lazy step, a complete sibling group, the deferral and age caps, or the adaptive budget); then every
  queued lazy step of every request goes into that one PRM call, and they ride along with any PRM batch
  that runs anyway. Each step carries its request's policy, resolved once by the runtime at the verifier's
  threshold; a policy of the "request" flush scope (an ablation) flushes its own request's steps only;
- `ONE_REQUEST` steps (FastTTS's "per_request") are ready at once but a PRM batch holds one request's steps only;
- `LOCK_STEP` steps ("lock_step", `beam-sync`) are never ready by themselves: they wait for the flush below;
- `RIDE_ALONG` items (partial-step readouts, `Verify.partial`) are never ready by themselves either: they join
  every shared PRM batch that runs and the flush below, and count toward no lazy trigger.
When the generator has nothing to run (`any_batch`: lazy verification's fourth trigger, docs/design.md "Verification"; every live sequence paused for
scores, speculative ones without room in the row budget included), whatever is queued is flushed: waiting
would only idle the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specscale.runtime.lazy_flush import FlushSignals, LazyFlushPolicy
from specscale.seam import ScoreRequest
from specscale.search.verification import BatchMode


class Batching:
    """How the verify queue batches one verification policy's steps; the base batches nothing by itself."""

    shared = True  # its steps join PRM batches of several requests

    def ready(self, item: QueuedStep) -> bool:
        """Is this step ready for a shared batch without any trigger?"""
        return False

    def rides_along(self, item: QueuedStep) -> bool:
        """Does this step join a shared PRM batch that runs anyway?"""
        return False

    def deferred(self, item: QueuedStep) -> None:
        """A tick passed without flushing this step."""

    def own_batch(self, items: list[QueuedStep], head: QueuedStep) -> list[QueuedStep]:
        """The PRM batch of its own that `head` (this policy's first queued step) makes up, if any."""
        return []


class AtOnce(Batching):
    def ready(self, item: QueuedStep) -> bool:
        return True


class Lazy(Batching):
    """Waits for a trigger of the step's `LazyFlushPolicy` (`VerifyQueue._triggered_lazy`)."""

    def rides_along(self, item: QueuedStep) -> bool:
        return item.policy.rides_along

    def deferred(self, item: QueuedStep) -> None:
        item.deferrals += 1


class RideAlong(Batching):
    """A partial-step readout (`Verify.partial`, partial rejection): joins every shared PRM batch that runs
    anyway (and the idle flush), never triggers one, and counts toward no lazy trigger."""

    def rides_along(self, item: QueuedStep) -> bool:
        return True


class OneRequest(Batching):
    """Ready at once, but a PRM batch holds one request's steps only (FastTTS)."""

    shared = False

    def own_batch(self, items: list[QueuedStep], head: QueuedStep) -> list[QueuedStep]:
        return [i for i in items if i.request is head.request and i.batching is self]


class LockStep(Batching):
    """Never ready by itself: held until the generator has nothing to run (`VerifyQueue.any_batch`), i.e. every
    request in flight has generated its round, then scored with all of them in one PRM call (search-and-learn's
    batched loop: one generate call for every beam of every problem, then one scoring call)."""


AT_ONCE, LAZY, ONE_REQUEST, LOCK_STEP, RIDE_ALONG = AtOnce(), Lazy(), OneRequest(), LockStep(), RideAlong()
BATCHINGS: dict[BatchMode, Batching] = {
    BatchMode.AT_ONCE: AT_ONCE, BatchMode.LAZY: LAZY, BatchMode.ONE_REQUEST: ONE_REQUEST, BatchMode.LOCK_STEP: LOCK_STEP,
}  # the verification policy's mode (search/verification.py) -> how this queue carries it out


@dataclass(eq=False)
class QueuedStep:
    request: object  # the runtime's `RequestState` (request_state.py imports this module)
    candidate: int
    score_request: ScoreRequest
    completes_group: bool
    batching: Batching
    tokens: int  # PRM input tokens scoring it would compute now
    enqueued_at: float
    policy: LazyFlushPolicy | None  # lazy steps' flush policy; None for the other batchings
    deferrals: int = 0


class VerifyQueue:
    def __init__(self):
        self.items: list[QueuedStep] = []
        self.flush_reasons: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item: QueuedStep) -> None:
        self.items.append(item)

    def ready_batch(self, now: float, signals: Callable[[], FlushSignals] = FlushSignals) -> list[QueuedStep]:
        """signals() builds the tick's `FlushSignals`, called at most once and only if a policy needs them."""
        eager = [i for i in self.items if i.batching.ready(i)]
        eager += self._triggered_lazy(now, signals)
        if eager:
            return self._take(eager + self._riders(eager))
        for head in self.items:
            own = head.batching.own_batch(self.items, head)
            if own:
                return self._take(own)
        return []

    def any_batch(self) -> list[QueuedStep]:
        """The generator is idle: flush everything (one request's steps if FastTTS steps are first)."""
        self.flush_reasons["idle"] = self.flush_reasons.get("idle", 0) + 1
        head = self.items[0]
        if not head.batching.shared:
            return self._take(head.batching.own_batch(self.items, head))
        return self._take([i for i in self.items if i.batching.shared])

    def _triggered_lazy(self, now: float, signals: Callable[[], FlushSignals]) -> list[QueuedStep]:
        """The lazy steps a trigger flushes now: the whole queue when a whole-queue policy's trigger holds
        (one flush counted, by the first such trigger in queue order), and the own steps of each
        request-scope policy whose trigger holds (one flush each)."""
        lazy = [i for i in self.items if i.batching is LAZY]
        queued_tokens = sum(i.tokens for i in lazy)
        read_once = _Once(signals)
        ready: list[QueuedStep] = []
        whole_queue_reason = None
        for items in _by_request(lazy):
            policy = items[0].policy
            if policy.whole_queue and whole_queue_reason is not None:
                continue  # the whole queue flushes anyway
            reason = policy.trigger(items, queued_tokens, now, read_once)
            if reason is None:
                continue
            if policy.whole_queue:
                whole_queue_reason = reason
            else:
                self._count(reason)
                ready += items
        if whole_queue_reason is not None:
            self._count(whole_queue_reason)
            ready += [i for i in lazy if i.policy.whole_queue]
        return ready

    def _count(self, reason: str) -> None:
        self.flush_reasons[reason] = self.flush_reasons.get(reason, 0) + 1

    def _riders(self, batch: list[QueuedStep]) -> list[QueuedStep]:
        """Lazy steps whose policy rides along with a PRM batch that runs anyway (one "ride-along" flush
        counted per batch they join)."""
        chosen = set(map(id, batch))
        riders = [i for i in self.items if i.batching.rides_along(i) and id(i) not in chosen]
        if riders:
            self._count("ride-along")
        return riders

    def count_deferral(self) -> None:
        """A tick passed without flushing these: one deferral each."""
        for item in self.items:
            item.batching.deferred(item)

    def drop_candidates(self, request: object, candidates: set[int]) -> None:
        self.items = [i for i in self.items if not (i.request is request and i.candidate in candidates)]

    def drop_request(self, request: object) -> None:
        self.items = [i for i in self.items if i.request is not request]

    def _take(self, batch: list[QueuedStep]) -> list[QueuedStep]:
        chosen = set(map(id, batch))
        self.items = [i for i in self.items if id(i) not in chosen]
        return batch


def _by_request(items: list[QueuedStep]) -> list[list[QueuedStep]]:
    """items grouped by request, in queue order of each request's first item."""
    groups: dict[int, list[QueuedStep]] = {}
    for item in items:
        groups.setdefault(id(item.request), []).append(item)
    return list(groups.values())


class _Once:
    """A zero-argument callable's value, computed on the first call only."""

    def __init__(self, compute: Callable[[], FlushSignals]):
        self._compute = compute
        self._value: FlushSignals | None = None

    def __call__(self) -> FlushSignals:
        if self._value is None:
            self._value = self._compute()
        return self._value
