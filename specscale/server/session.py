"""SearchSession: one HTTP request's search on the asyncio side, from submission to its last event.

It yields the search's events (round progress, then the outcome) and ends the search early when the
client disconnects or the request's time budget runs out: either one sends a cancel to the engine
thread, which frees the search's KV blocks before its next tick. The client's disconnect is watched
on the ASGI `receive` channel (an `http.disconnect` message), so it is noticed at once, also while a
non-streaming request is waiting and while a stream has nothing to send.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from specscale.server.engine_loop import EngineLoop, Outcome, RequestHandle, RoundProgress


@dataclass(frozen=True)
class Interrupted:
    """The session ended before the search did: reason "disconnect" or "timeout"."""

    reason: str


class SearchSession:
    def __init__(self, engine_loop: EngineLoop, handle: RequestHandle, receive, timeout_s: float):
        self.engine_loop = engine_loop
        self.handle = handle
        self.timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + timeout_s
        self._disconnected = asyncio.ensure_future(_wait_for_disconnect(receive))
        self._open = True  # the search may still be running on the engine thread
        self._next: asyncio.Future | None = None  # the pending read of the handle's queue

    async def events(self) -> AsyncIterator[RoundProgress | Outcome | Interrupted]:
        """Every event up to and including the last one (an Outcome or an Interrupted)."""
        while self._open:
            event = await self._next_event()
            if not isinstance(event, RoundProgress):
                self._open = False
            yield event

    async def outcome(self) -> Outcome | Interrupted:
        """The last event, skipping progress."""
        async for event in self.events():
            if not isinstance(event, RoundProgress):
                return event

    async def client_gone(self, turns: int = 8) -> bool:
        """Whether the client has gone, after letting the event loop take in what its socket already holds
        (a close that arrived takes a few loop turns to surface as an `http.disconnect`)."""
        for _ in range(turns):
            if self._disconnected.done():
                return True
            await asyncio.sleep(0)
        return self._disconnected.done()

    def close(self) -> None:
        """The response is over (sent, failed or abandoned): cancel the search if it is still running."""
        self._disconnected.cancel()
        if self._next is not None:
            self._next.cancel()
        if self._open:
            self._interrupt("disconnect")

    async def _next_event(self) -> RoundProgress | Outcome | Interrupted:
        remaining = max(self._deadline - self._loop.time(), 0.0)
        self._next = next_event = asyncio.ensure_future(self.handle.events.get())
        done, _ = await asyncio.wait({next_event, self._disconnected}, timeout=remaining,
                                     return_when=asyncio.FIRST_COMPLETED)
        self._next = None
        if next_event in done:
            return next_event.result()
        next_event.cancel()
        return self._interrupt("disconnect" if self._disconnected in done else "timeout")

    def _interrupt(self, reason: str) -> Interrupted:
        self._open = False
        self.engine_loop.cancel(self.handle.request_id, reason)
        return Interrupted(reason)


async def _wait_for_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
