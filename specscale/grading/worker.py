"""math-verify in a child process, so that no answer can stall the process that asks.

math-verify bounds its own work with ``signal.alarm``, which only works on a process's main thread (off
it, any timeout raises ``ValueError``), and a signal cannot interrupt work inside one C call at all:
``\\boxed{9^{9^{9}}}`` against ``\\boxed{2^{2^{40}}}`` sends sympy into big-integer arithmetic that runs
for hours from a dozen characters, so bounding the input size is no defence. Here each comparison runs
on the main thread of a child process (`serve` in a fresh interpreter that imports nothing but
math-verify, never a fork of a process with torch and server threads): a real-time interval timer
(``setitimer``, fractional seconds) interrupts ordinary slow parsing and simplification cleanly, and the
parent, which waits with a deadline of its own, kills and restarts the child when even that does not
come back. A comparison that timed out counts as "not equivalent". POSIX only (``setitimer``, ``select``
on a pipe).

The protocol is one JSON line each way: ``{"gold", "answer", "timeout_s"}`` in, ``true`` / ``false`` /
``null`` (timed out) out, after a first line ``null`` that says the child's imports are done.
`VerifyWorker` is the parent's handle: thread-safe (one comparison at a time, under a lock), started on
first use (or `start()`), restarted in the background after a kill.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
from functools import lru_cache
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0  # importing sympy and math-verify on a loaded machine
KILL_GRACE_S = 1.0  # the parent waits this long past a comparison's own timeout before killing the child
PARSE_CACHE_SIZE = 1 << 14  # parsed answers the child keeps
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # where `specscale` is importable from
# The child ignores Ctrl-C (the parent, in the same process group, handles it and stops the child) and dies
# quietly of SIGPIPE when the parent is gone (Python would raise BrokenPipeError): set before any import.
CHILD_MAIN = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
              "signal.signal(signal.SIGPIPE, signal.SIG_DFL); "
              "from specscale.grading.worker import serve; sys.exit(serve())")


class VerifyWorker:
    """The parent side: `equivalent(gold, answer, timeout_s)` -> True / False, or None when the
    comparison timed out or the child died (the child is then replaced)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._ready = False  # the child reported its imports done
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        """The child's process id; None while no child runs."""
        return None if self._process is None else self._process.pid

    def equivalent(self, gold: str, answer: str, timeout_s: float) -> bool | None:
        with self._lock:
            self._wait_ready()
            self._send({"gold": gold, "answer": answer, "timeout_s": timeout_s})
            reply = self._receive(timeout_s + KILL_GRACE_S)
            if reply is not None:
                return json.loads(reply)
            self._stop_child()
            self.restarts += 1
            self._start_child()  # it imports while the caller goes on; the next comparison waits for it
            return None

    def start(self) -> None:
        """Start the child now without waiting for it (its imports overlap the caller's own start-up)."""
        with self._lock:
            if self._process is None:
                self._start_child()

    def close(self) -> None:
        """Stop the child (a later comparison starts a new one)."""
        with self._lock:
            self._stop_child()

    def _wait_ready(self) -> None:
        if self._process is None:
            self._start_child()
        if not self._ready:
            if self._receive(STARTUP_TIMEOUT_S) != "null":
                self._stop_child()
                raise RuntimeError("the math-verify worker did not start (is math-verify installed?)")
            self._ready = True

    def _send(self, message: dict) -> None:
        self._process.stdin.write(json.dumps(message).encode() + b"\n")
        self._process.stdin.flush()

    def _receive(self, timeout_s: float) -> str | None:
        """The child's next line, or None if it sent none within timeout_s (or died)."""
        readable, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        line = self._process.stdout.readline() if readable else b""
        return line.decode().strip() or None

    def _start_child(self) -> None:
        path = os.pathsep.join(filter(None, (PACKAGE_PARENT, os.environ.get("PYTHONPATH"))))
        self._process = subprocess.Popen([sys.executable, "-c", CHILD_MAIN],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=dict(os.environ, PYTHONPATH=path))
        self._ready = False

    def _stop_child(self) -> None:
        if self._process is None:
            return
        self._process.kill()
        self._process.wait()
        self._process.stdin.close()
        self._process.stdout.close()
        self._process, self._ready = None, False


# ---- the child ------------------------------------------------------------------------------------
class ComparisonTimeout(BaseException):
    """Raised by the interval timer; a BaseException so that math-verify's `except Exception` lets it through."""


def serve() -> int:
    """Child main loop: report the imports done, then answer one comparison per input line."""
    replies = sys.stdout
    sys.stdout = sys.stderr  # a stray print must not corrupt the protocol
    import math_verify  # noqa: F401 (the parent never loads sympy)

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" notice: we time it
    signal.signal(signal.SIGALRM, _raise_timeout)
    print("null", file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        verdict = compare(request["gold"], request["answer"], request["timeout_s"])
        print(json.dumps(verdict), file=replies, flush=True)
    return 0


def compare(gold: str, answer: str, timeout_s: float) -> bool | None:
    """math-verify's verdict on two boxed answers (gold first: its rules are not symmetric), or None
    past timeout_s."""
    from math_verify import verify

    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            return bool(verify(_parsed(gold), _parsed(answer), timeout_seconds=None, raise_on_error=False))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ComparisonTimeout:  # also when the timer fires between the verdict and the reset
        return None


@lru_cache(maxsize=PARSE_CACHE_SIZE)
def _parsed(answer: str) -> list:
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", parsing_timeout=None, raise_on_error=False)


def _raise_timeout(signum, frame):
    raise ComparisonTimeout()
