"""VirtualClock: simulated seconds for code that reads time through a clock callable.

`SearchRuntime` reads time only through its `clock` argument (`time.perf_counter` by default); given a
`VirtualClock` instead, every duration it measures is the simulated time that the simulated runners (and
the tests' scripted backends) advance the clock by.
"""

from __future__ import annotations


class VirtualClock:
    """Call it for the time now; only `advance` moves it, never backwards."""

    def __init__(self, start: float = 0.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds})")
        self.now += seconds

    def advance_to(self, time: float) -> None:
        """Move to `time` exactly (a sum of advances may stop an ulp short of it); never backwards."""
        self.now = max(self.now, time)
