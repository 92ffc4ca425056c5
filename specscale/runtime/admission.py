"""Admission: which searches start (docs/architecture.md, step 2).

Submitted requests wait in submission order under ids unique among those waiting, running and finished; at
most `max_concurrency` searches are in flight, and the next waiting one starts when a slot frees. A lock-step
request (`RequestState.lock_step`, `beam-sync`) starts only in a wave: when nothing was in flight at the start of
the admission pass, up to `max_concurrency` of them start together, and later ones wait for the whole wave to
end (search-and-learn's batch of problems; the batch size is `max_concurrency`).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Container

from specscale.runtime.request_state import RequestState, SearchRequest


class Admission:
    def __init__(self, max_concurrency: int):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.waiting: deque[RequestState] = deque()
        self.active: dict[str, RequestState] = {}
        self._ids = itertools.count()

    def request_id(self, request: SearchRequest, finished: Container[str]) -> str:
        """The request's own id, else the next `req-N`; an id already waiting, running or finished raises."""
        request_id = request.request_id or f"req-{next(self._ids)}"
        if request_id in self.active or request_id in finished or any(
                r.request_id == request_id for r in self.waiting):
            raise ValueError(f"request id {request_id!r} is already used")
        return request_id

    def wait(self, state: RequestState) -> None:
        self.waiting.append(state)

    def can_admit(self) -> bool:
        """The longest-waiting request may start now (a lock-step one only into an empty runtime: a new wave)."""
        return self._slot_for_head() and (not self.waiting[0].lock_step or not self.active)

    def admit_ready(self, clock: Callable[[], float]) -> list[RequestState]:
        """One admission pass: the waiting requests that start now, longest-waiting first, each stamped with the
        clock. A lock-step request joins only a wave this pass opened (nothing was in flight when it began)."""
        wave = not self.active
        admitted = []
        while self._slot_for_head() and (wave or not self.waiting[0].lock_step):
            admitted.append(self.admit_next(clock()))
        return admitted

    def _slot_for_head(self) -> bool:
        return bool(self.waiting) and len(self.active) < self.max_concurrency

    def admit_next(self, now: float) -> RequestState:
        """The longest-waiting request, now in flight."""
        state = self.waiting.popleft()
        state.admitted_at = now
        self.active[state.request_id] = state
        return state

    def withdraw(self, request_id: str) -> RequestState | None:
        """Take a request out of the waiting line; None if it is not waiting."""
        waiting = next((s for s in self.waiting if s.request_id == request_id), None)
        if waiting is not None:
            self.waiting.remove(waiting)
        return waiting

    def leave(self, state: RequestState) -> None:
        """A search in flight has finished: its slot frees."""
        self.active.pop(state.request_id, None)

    def has_work(self) -> bool:
        return bool(self.waiting or self.active)

    def free_slots(self) -> int:
        return max(self.max_concurrency - len(self.active), 0)
