"""DrainingServer: uvicorn's server with a graceful drain on SIGTERM / Ctrl-C.

The first signal starts the drain: the engine loop refuses new searches with 503 + Retry-After (and
`/health` answers 503 "draining", so a load balancer moves away) while the listening socket stays open
and the searches already accepted run to their end or their time budget. Once none is left (or
`drain_timeout_s` has passed) uvicorn's own shutdown runs: it finishes the responses being sent, closes
the connections, and the app's lifespan stops the engine thread. A second signal skips the wait, a third
(Ctrl-C) also skips uvicorn's graceful shutdown.

The signal is not re-raised after the shutdown (uvicorn re-raises the ones it caught), so `specscale
serve` exits 0 after a drain (docs/architecture.md, "Serving over HTTP").
"""

from __future__ import annotations

import logging
import signal
import time

import uvicorn

from specscale.server.engine_loop import EngineLoop

log = logging.getLogger("specscale.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, engine_loop: EngineLoop, drain_timeout_s: float):
        super().__init__(config)
        self.engine_loop = engine_loop
        self.drain_timeout_s = drain_timeout_s
        self.drain_deadline: float | None = None  # set by the first signal
        self.drained_in_time: bool | None = None  # once the drain is over

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain_deadline is None:
            log.info("signal %s: draining (new searches get 503; up to %g s for the running ones)",
                     signal.Signals(sig).name, self.drain_timeout_s)
            self.engine_loop.drain()
            self.drain_deadline = time.monotonic() + self.drain_timeout_s
        elif self.should_exit:
            self.force_exit = True
        else:
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            idle = self.engine_loop.idle()
            if idle or time.monotonic() >= self.drain_deadline:
                self.drained_in_time = idle
                self.should_exit = True
        return await super().on_tick(counter)
