"""A `specscale serve` subprocess for the tests: its output in a log file, its URL read from the log once it
is up (and, for a plain server, once /health answers 200), stopped with a signal and killed if it does not
exit in time. Used by test_server, test_server_drain, test_scaleout_cli and test_readme_examples."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PLAIN_URL = r"at (http://\S+)"  # `specscale serve`'s start-up line
RAY_URL = r"Ray Serve replicas at (http://\S+)"  # `specscale serve --ray`'s


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen
    log: Path
    exit_code: int | str | None = None  # set once stopped ("killed" if it had to be)

    def assert_stopped_cleanly(self) -> None:
        text = self.log.read_text()
        assert self.exit_code == 0 and "SpecScale stopped" in text, f"exit {self.exit_code}:\n{text[-3000:]}"


@contextmanager
def serving(command: list[str], log: Path, url_pattern: str = PLAIN_URL, check_health: bool = True,
            start_timeout_s: float = 120.0, stop_signal: int = signal.SIGINT,
            stop_timeout_s: float = 20.0) -> Iterator[ServerProcess]:
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    server = ServerProcess("", process, log)
    try:
        server.url = wait_for_url(log, process, url_pattern, check_health, start_timeout_s)
        yield server
    finally:
        process.send_signal(stop_signal)
        try:
            server.exit_code = process.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            server.exit_code = "killed"


def wait_for_url(log: Path, process: subprocess.Popen, url_pattern: str, check_health: bool,
                 timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(url_pattern, log.read_text())
        if found and (not check_health or httpx.get(f"{found[1]}/health", timeout=10).status_code == 200):
            return found[1]
        if process.poll() is not None:
            raise AssertionError(f"the server exited early:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"the server did not start:\n{log.read_text()[-3000:]}")


def streamed_lines(url: str, payload: dict, timeout_s: float = 150.0) -> list[str]:
    """The non-empty lines of a streamed chat completion (its status must be 200)."""
    with httpx.Client(base_url=url, timeout=timeout_s) as h, \
            h.stream("POST", "/v1/chat/completions", json=payload) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def wait_for(condition, message: str, timeout_s: float = 60.0) -> None:
    """Until `condition()` holds (a hang guard, not a speed limit)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.02)
