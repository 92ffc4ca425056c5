"""The server's periodic malloc_trim (server/memory_trim.py): called every period on a thread of its own
between start() and stop(), a no-op where the C library is not glibc, started and stopped by the app."""

from __future__ import annotations

import threading

from specscale.server import memory_trim
from specscale.server.memory_trim import MemoryTrimmer


def test_the_trimmer_calls_trim_periodically_until_stopped():
    calls = threading.Event()
    count = 0

    def fake_trim():
        nonlocal count
        count += 1
        if count >= 3:
            calls.set()

    trimmer = MemoryTrimmer(every_s=0.001, trim=fake_trim)
    trimmer.start()
    assert calls.wait(timeout=30), "the trimmer did not call trim three times"
    trimmer.stop()
    stopped_at = count
    assert trimmer._thread is None and trimmer.trims == stopped_at >= 3
    trimmer.stop()  # twice is harmless


def test_no_glibc_no_trimmer_thread(monkeypatch):
    monkeypatch.setattr(memory_trim.platform, "libc_ver", lambda: ("", ""))
    assert memory_trim.malloc_trim() is None
    trimmer = MemoryTrimmer(every_s=0.001)
    trimmer.start()
    assert trimmer._thread is None
    trimmer.stop()


def test_glibc_trim_is_callable_here_when_the_libc_is_glibc():
    trim = memory_trim.malloc_trim()
    if memory_trim.platform.libc_ver()[0] == "glibc":
        assert trim is not None and trim() in (0, 1)


def test_the_app_runs_the_trimmer_while_it_serves(tmp_path):
    from live_app import live_builder, serve
    from specscale.server.settings import ServerSettings

    def trimmer_threads() -> int:
        return sum(t.name == "specscale-malloc-trim" and t.is_alive() for t in threading.enumerate())

    settings = ServerSettings(served_model_name="tiny")
    before = trimmer_threads()
    with serve(live_builder(tmp_path / "tok", settings), settings):
        assert trimmer_threads() == before + (memory_trim.malloc_trim() is not None)
    assert trimmer_threads() == before
