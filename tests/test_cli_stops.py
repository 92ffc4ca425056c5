"""Ctrl-C and SIGTERM stop a command at once (issue 45): one line on stderr, no traceback, the shell's status
(130 for SIGINT, 143 for SIGTERM), and no process of the command left behind, the simulator's cell workers
(bench/cell_pool.py) included. Each command runs in its own process group, as at a terminal, where Ctrl-C
reaches every process of the group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specscale.cli import Terminated, interrupted_status, interrupted_text, typed_command

STOP_WITHIN_S = 5.0
CLI = [sys.executable, "-m", "specscale.cli"]
POLL_S = 0.1


def group_members(group: int) -> list[int]:
    """The live processes of a process group (from /proc; zombies are dead)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            members += [int(entry.name)] if member_of(entry, group) else []
    return members


def member_of(entry: Path, group: int) -> bool:
    try:
        fields = (entry / "stat").read_text().rpartition(")")[2].split()
    except OSError:  # it exited while we looked
        return False
    state, process_group = fields[0], int(fields[2])
    return process_group == group and state != "Z"


def start(arguments: list[str], out: Path) -> subprocess.Popen:
    environment = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([*CLI, *arguments], stdout=(out / "stdout").open("w"), stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=environment, cwd=out)


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_S)
    return condition()


def stop(process: subprocess.Popen, signal_number: int) -> tuple[float, str]:
    """Signal the command's whole group; the seconds it took to exit and its stderr."""
    os.killpg(process.pid, signal_number)
    sent = time.monotonic()
    try:
        _, stderr = process.communicate(timeout=STOP_WITHIN_S + 10)
    finally:
        kill_group(process.pid)
    return time.monotonic() - sent, stderr


def kill_group(group: int) -> None:
    """Whatever the test left running: SIGKILL to the group, ignored when it is gone."""
    if group_members(group):
        os.killpg(group, signal.SIGKILL)


def assert_stopped_cleanly(process: subprocess.Popen, seconds: float, stderr: str, status: int) -> None:
    assert seconds < STOP_WITHIN_S, f"took {seconds:.1f} s to stop; stderr:\n{stderr}"
    assert "Traceback" not in stderr and "leaked" not in stderr, stderr
    assert process.returncode == status, stderr
    assert "interrupted" in stderr.strip().splitlines()[-1]
    assert wait_until(lambda: not group_members(process.pid), 2.0), f"left running: {group_members(process.pid)}"


@pytest.mark.timeout(60)
def test_ctrl_c_stops_simulate_and_its_cell_workers(tmp_path):
    process = start(["simulate", "throughput", "--quick", "--variants", "beam,specscale", "--workers", "2",
                     "--out", str(tmp_path / "simulate")], tmp_path)
    workers_started = wait_until(lambda: len(group_members(process.pid)) >= 3, 30)  # parent, tracker, workers
    assert workers_started and process.poll() is None, process.stderr.read() if process.poll() is not None else ""
    time.sleep(1.0)  # the workers past their imports, serving cells
    seconds, stderr = stop(process, signal.SIGINT)
    assert_stopped_cleanly(process, seconds, stderr, 130)
    assert "of 4 cells" in stderr.strip().splitlines()[-1]


@pytest.mark.timeout(60)
def test_ctrl_c_and_sigterm_stop_solve(tmp_path):
    for signal_number, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        process = start(["solve", "--problems", "64", "--quiet"], tmp_path)
        time.sleep(4.0)  # loading the models, then searching
        assert process.poll() is None, process.stderr.read()
        seconds, stderr = stop(process, signal_number)
        assert_stopped_cleanly(process, seconds, stderr, status)


def test_the_interrupt_line_and_status():
    assert interrupted_text(KeyboardInterrupt()) == "interrupted"
    assert interrupted_text(KeyboardInterrupt("after 3 of 8 cells")) == "interrupted after 3 of 8 cells"
    assert (interrupted_status(KeyboardInterrupt()), interrupted_status(Terminated())) == (130, 143)


def test_the_command_is_named_as_typed():
    assert typed_command(["simulate", "throughput", "--quick"]) == "specscale simulate throughput"
    assert typed_command(["solve", "--problems", "3"]) == "specscale solve"
    assert typed_command([]) == "specscale"


@pytest.mark.timeout(150)
def test_the_grading_worker_leaves_ctrl_c_to_its_parent():
    """`eval`'s math-verify child shares the terminal's process group: Ctrl-C must not end it with a traceback
    of its own; the parent stops it."""
    from specscale.grading.worker import VerifyWorker

    worker = VerifyWorker()
    try:
        assert worker.equivalent("2", "2", 5.0) is True
        os.kill(worker.pid, signal.SIGINT)
        assert worker.equivalent("1/2", "0.5", 5.0) is True and worker.restarts == 0
    finally:
        worker.close()


def test_cells_are_reported_line_by_line_where_no_bar_is_drawn():
    import io

    from specscale_lab.bench.cell_pool import CellLines

    stream, now = io.StringIO(), iter([0.0, 30.0, 90.0])
    lines = CellLines(4, drawn=False, stream=stream, clock=lambda: next(now))
    lines.cells_done(1)
    lines.cells_done(1)  # no new cell: no new line
    lines.cells_done(2)
    assert stream.getvalue().splitlines() == ["4 cells to run", "cell 1 of 4 done, elapsed 00:30, ETA 01:30",
                                              "cell 2 of 4 done, elapsed 01:30, ETA 01:30"]
    drawn = io.StringIO()
    CellLines(4, drawn=True, stream=drawn).cells_done(1)
    assert drawn.getvalue() == ""


def test_an_interrupted_solve_says_how_many_searches_had_finished():
    from specscale_lab.solve import run_counting

    class Runtime:  # finishes two searches, then the user presses Ctrl-C (or the process gets SIGTERM)
        def __init__(self, interrupt: KeyboardInterrupt):
            self.interrupt = interrupt

        def run(self, requests, progress):
            progress(1)
            progress(1)
            raise self.interrupt

    class Bar:
        def update(self, count: int) -> None:
            pass

    for interrupt, status in ((KeyboardInterrupt(), 130), (Terminated(), 143)):
        with pytest.raises(KeyboardInterrupt) as raised:
            run_counting(Runtime(interrupt), ["q"] * 5, Bar())
        assert interrupted_text(raised.value) == "interrupted after 2 of 5 searches"
        assert interrupted_status(raised.value) == status


@pytest.mark.timeout(90)
@pytest.mark.parametrize("arguments", [
    ["bench", "throughput", "--quick", "--variants", "beam,specscale", "--out", "bench"],
    ["eval", "--dataset", "gsm8k", "--preset", "beam", "--problems", "96", "--out", "eval"],
])
def test_ctrl_c_stops_bench_and_eval(tmp_path, arguments):
    process = start(arguments, tmp_path)
    time.sleep(6.0)  # loading the models, then serving
    assert process.poll() is None, process.stderr.read()
    seconds, stderr = stop(process, signal.SIGINT)
    assert_stopped_cleanly(process, seconds, stderr, 130)
