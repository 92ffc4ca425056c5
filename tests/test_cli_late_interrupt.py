"""Ctrl-C as a command ends (issue 45): `eval` prints its report last, a fraction of a second before the process
ends, and Ctrl-C then ended the process by the signal (status -2) with no line. From the command's return on, a
signal prints the command's one interrupt line and exits 130 / 143; during Python's own teardown (the last
part, after the atexit callbacks) the signal is ignored and the command's status stands. Never a status by
signal, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ENVIRONMENT = dict(os.environ, PYTHONUNBUFFERED="1")
PROCESS_END = """
import os, signal, sys, time
from specscale import cli
cli.exit_as_command("specscale eval", {status})
"""


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=ENVIRONMENT)


@pytest.mark.parametrize(("signal_number", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_after_the_command_returned_is_its_interrupt(signal_number, status):
    done = run_python(PROCESS_END.format(status=0) + f"os.kill(os.getpid(), {int(signal_number)}); time.sleep(10)")
    assert done.returncode == status, done.stderr
    assert done.stderr.strip().splitlines() == ["specscale eval: interrupted"]


def test_a_command_that_was_interrupted_says_so_once():
    done = run_python(PROCESS_END.format(status=130) + "os.kill(os.getpid(), signal.SIGINT); time.sleep(10)")
    assert (done.returncode, done.stderr.strip()) == (130, "")


def test_a_signal_during_python_teardown_leaves_the_commands_status():
    """An object that module teardown deletes signals the process: by then Python has put back the default
    dispositions, where SIGINT killed the process (-2) silently."""
    teardown = ("class LastWords:\n"
                "    def __del__(self):\n"
                "        os.kill(os.getpid(), signal.SIGINT)\n"
                "        os.kill(os.getpid(), signal.SIGTERM)\n"
                "        time.sleep(0.2)\n"
                "last_words = LastWords()\n")
    done = run_python(PROCESS_END.format(status=0) + teardown)
    assert (done.returncode, done.stderr.strip()) == (0, "")
    unarmed = PROCESS_END.format(status=0).replace('cli.exit_as_command("specscale eval", 0)', "")
    plain = run_python(unarmed + teardown)
    assert plain.returncode == -signal.SIGINT  # what the test guards against, shown on a process not armed


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay_s", [0.0, 0.1])
def test_ctrl_c_at_evals_report(tmp_path, delay_s):
    command = [sys.executable, "-m", "specscale.cli", "eval", "--dataset", "gsm8k", "--preset", "beam",
               "--problems", "1", "--beam-size", "4", "--max-rounds", "2", "--out", str(tmp_path / "eval")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=ENVIRONMENT, start_new_session=True)
    try:
        for line in process.stdout:
            if line.startswith("# specscale eval"):  # the report's first line
                time.sleep(delay_s)
                os.killpg(process.pid, signal.SIGINT)
                break
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode in (0, 130), stderr  # never -2: ended by the signal
    assert "Traceback" not in stderr, stderr
    if process.returncode == 130:
        assert stderr.strip().splitlines()[-1] == "specscale eval: interrupted", stderr
