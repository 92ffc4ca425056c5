"""A periodic malloc_trim: glibc's allocator hands the free memory at the top of its heaps back to the OS.

A server's Python and torch objects come and go in many small allocations across threads; glibc keeps what
they free in its arenas (one per thread that allocated), so resident memory stays near its high-water mark
long after a burst of load has passed. `malloc_trim(0)` returns the free pages of every arena. The server
calls it every `TRIM_EVERY_S` from a daemon thread (started and stopped with the app's lifespan,
server/app.py); it takes a few milliseconds and holds no lock of ours. Not glibc (musl, macOS, Windows):
`MemoryTrimmer` does nothing. The soak that measures resident memory over time: docs/bench/serve-soak.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import threading
from collections.abc import Callable

TRIM_EVERY_S = 30.0


def malloc_trim() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)` as a callable, or None where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


class MemoryTrimmer:
    """Calls malloc_trim every `every_s` seconds on a daemon thread between start() and stop()."""

    def __init__(self, every_s: float = TRIM_EVERY_S, trim: Callable[[], object] | None = None):
        self.every_s = every_s
        self.trim = trim if trim is not None else malloc_trim()
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.trim is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="specscale-malloc-trim", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.trim()
            self.trims += 1

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()
