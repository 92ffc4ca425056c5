"""Queued verifications and the policy deciding which of them make up the next PRM batch.

- "round" and "immediate" steps are ready at once (a request's whole round, or each step as it
  finishes), batched across requests;
- "lazy" steps (lazy verification, SPEC 3.3) wait until one trigger holds: the queued PRM input
  tokens reach the threshold; a queued step completed its sibling group; a queued step was deferred
  more than max_deferrals ticks; a queued step is older than max_age_s (wall-clock safeguard);
- "per_request" steps (FastTTS) are ready at once but a PRM batch holds one request's steps only.
When the generator has nothing to do, whatever is queued is flushed (waiting would gain nothing).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class QueuedStep:
    request: object  # the runtime's request state
    candidate: int
    score_request: object  # verify.prm.ScoreRequest
    completes_group: bool
    mode: str
    tokens: int  # PRM input tokens scoring it would compute now
    enqueued_at: float
    threshold_tokens: int | None
    max_deferrals: int
    max_age_s: float
    deferrals: int = 0


class VerifyQueue:
    def __init__(self, default_threshold_tokens: int):
        self.default_threshold_tokens = default_threshold_tokens
        self.items: list[QueuedStep] = []
        self.flush_reasons: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item: QueuedStep) -> None:
        self.items.append(item)

    def ready_batch(self, now: float) -> list[QueuedStep]:
        eager = [i for i in self.items if i.mode in ("round", "immediate")]
        lazy = [i for i in self.items if i.mode == "lazy"]
        reason = self.lazy_trigger(lazy, now) if lazy else None
        if reason is not None:
            self.flush_reasons[reason] = self.flush_reasons.get(reason, 0) + 1
            eager += lazy
        if eager:
            return self._take(eager)
        per_request = [i for i in self.items if i.mode == "per_request"]
        if per_request:
            first = per_request[0].request
            return self._take([i for i in per_request if i.request is first])
        return []

    def any_batch(self) -> list[QueuedStep]:
        """The generator is idle: flush everything (one request's steps if FastTTS steps are first)."""
        self.flush_reasons["idle"] = self.flush_reasons.get("idle", 0) + 1
        head = self.items[0]
        if head.mode == "per_request":
            return self._take([i for i in self.items if i.request is head.request and i.mode == "per_request"])
        return self._take([i for i in self.items if i.mode != "per_request"])

    def lazy_trigger(self, lazy: list[QueuedStep], now: float) -> str | None:
        """Which lazy-verification trigger holds now, if any."""
        threshold = min(i.threshold_tokens or self.default_threshold_tokens for i in lazy)
        if sum(i.tokens for i in lazy) >= threshold:
            return "tokens"
        if any(i.completes_group for i in lazy):
            return "sibling-group"
        if any(i.deferrals > i.max_deferrals for i in lazy):
            return "deferrals"
        if any(now - i.enqueued_at > i.max_age_s for i in lazy):
            return "age"
        return None

    def count_deferral(self) -> None:
        """A tick passed without flushing these: one deferral each."""
        for item in self.items:
            if item.mode == "lazy":
                item.deferrals += 1

    def drop_candidates(self, request: object, candidates: set[int]) -> None:
        self.items = [i for i in self.items if not (i.request is request and i.candidate in candidates)]

    def drop_request(self, request: object) -> None:
        self.items = [i for i in self.items if i.request is not request]

    def _take(self, batch: list[QueuedStep]) -> list[QueuedStep]:
        chosen = set(map(id, batch))
        self.items = [i for i in self.items if id(i) not in chosen]
        return batch
