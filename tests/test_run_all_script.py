"""benchmarks/run_all.sh writes only where it is told (issue 45): results/bench/ by default, docs/bench/ with
UPDATE_DOCS=1, and refuses to start while another benchmark runs. The `specscale` it calls is a stub that
records its arguments, and the script runs from a copy in a temporary checkout."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "run_all.sh"
STUB = """#!/usr/bin/env bash
echo "$@" >> "$STUB_LOG"
"""

pytestmark = pytest.mark.skipif(shutil.which("pgrep") is None or not Path("/proc/stat").is_file(),
                                reason="needs pgrep and /proc")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "benchmarks").mkdir()
    shutil.copy(SCRIPT, tmp_path / "benchmarks" / "run_all.sh")
    (tmp_path / "bin").mkdir()
    stub = tmp_path / "bin" / "specscale"
    stub.write_text(STUB)
    stub.chmod(0o755)
    return tmp_path


def run_all(checkout: Path, **environment: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{checkout / 'bin'}{os.pathsep}{os.environ['PATH']}",
               STUB_LOG=str(checkout / "stub.log"), **environment)
    env.pop("OUT", None)
    return subprocess.run(["bash", str(checkout / "benchmarks" / "run_all.sh"), "--quick"], env=env, text=True,
                          capture_output=True, timeout=60, start_new_session=True)


def outs(checkout: Path) -> set[str]:
    words = (checkout / "stub.log").read_text().split()
    return {Path(words[i + 1]).parent.as_posix() for i, word in enumerate(words) if word == "--out"}


def test_results_go_under_results_unless_docs_are_asked_for(checkout):
    done = run_all(checkout, FORCE="1")
    assert done.returncode == 0, done.stderr
    assert outs(checkout) == {"results/bench"} and (checkout / "results" / "bench" / "profile-prm.md").is_file()
    assert not (checkout / "docs").exists()
    (checkout / "stub.log").unlink()
    done = run_all(checkout, FORCE="1", UPDATE_DOCS="1")
    assert done.returncode == 0, done.stderr
    assert outs(checkout) == {"docs/bench"} and (checkout / "docs" / "bench" / "profile-prm.md").is_file()


def test_another_benchmark_running_is_noticed(checkout):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "specscale", "bench", "latency"],
                             start_new_session=True)
    try:
        done = run_all(checkout)
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()
    assert done.returncode == 1 and "another benchmark is running" in done.stderr
    assert str(other.pid) in done.stderr and not (checkout / "stub.log").exists()
