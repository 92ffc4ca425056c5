"""CellPool: the cells of a simulated benchmark run, each on a fresh simulation, in K worker processes.

A simulated cell (one variant at one beam size, one repeat) is a deterministic function of the options and
the cell alone when it runs on a simulation of its own: the virtual clock starts at 0 and both KV pools and
prefix caches start empty, so no cell inherits another's clock offset or cached prompt blocks. That makes
the cells independent, and `--workers K` runs them in K processes with the very results one process gives
(docs/simulator.md, "Speed"). Real runs share one pipeline and run one cell at a time: their timings are wall
seconds, which parallel cells would distort.

Progress: the caller's bar on a terminal; elsewhere (a log, a pipe) one plain line per finished cell, with
the elapsed time and an ETA (`CellLines`). Ctrl-C reaches the parent alone: the workers start with SIGINT ignored, and the parent, on an interrupt or
any error, terminates and joins them before the exception goes on (no worker outlives the command).

`run_cell(stack, args, cell, progress)` is a module-level function (workers import it by name) that serves
one cell on `stack` and returns its record; `progress.update(n)` is told of finished requests.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

from tqdm import tqdm

# A simulation allocates millions of short-lived objects (rows, outputs, updates): with the default
# thresholds (700, 10, 10) the cyclic collector ran ~700 times in two N = 8 cells and took ~12% of their
# CPU time, mostly rescanning the long-lived imports; frozen imports and a larger first generation cut
# that to ~2%. Collection order does not affect any simulated result.
SIMULATION_GC_THRESHOLDS = (20_000, 20, 20)
MAX_DEFAULT_WORKERS = 2  # the default: min(this, cells, CPUs); more only when asked for
PROGRESS_POLL_S = 0.2  # how often the parent reads the workers' progress
WORKER_STOP_S = 5.0  # how long a terminated worker may take to exit before it is killed

CellRunner = Callable[..., dict]  # run_cell(stack: Testbed, args, cell, progress) -> the cell's record


def add_workers_argument(parser) -> None:
    parser.add_argument("--workers", type=int, default=None,
                        help=f"simulated cells run in this many processes (default: min({MAX_DEFAULT_WORKERS}, cells, "
                             "CPUs)); real runs take one cell at a time")


def resolve_workers(args, cells: int) -> int:
    """--workers as given, else the default; 1 on real models (their timings are wall seconds)."""
    if getattr(args, "backend", "real") != "sim":
        if args.workers not in (None, 1):
            raise SystemExit("--workers runs simulated cells in parallel; real runs take one cell at a time")
        return 1
    if args.workers is not None and args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    return args.workers or default_workers(cells)


def default_workers(cells: int) -> int:
    return max(1, min(MAX_DEFAULT_WORKERS, cells, os.cpu_count() or 1))


class SharedProgress:
    """A worker's progress: finished requests added to a counter all workers share with the parent."""

    def __init__(self, counter):
        self.counter = counter

    def update(self, n: int) -> None:
        with self.counter.get_lock():
            self.counter.value += n


_worker_progress: SharedProgress | None = None  # set in each worker process by `_start_worker`


def _start_worker(counter) -> None:
    global _worker_progress
    _worker_progress = SharedProgress(counter)
    collect_garbage_rarely()


def collect_garbage_rarely() -> None:
    """Leave what exists now (imports, the parent's stack) out of collections; collect young objects in
    larger batches (SIMULATION_GC_THRESHOLDS)."""
    gc.freeze()
    gc.set_threshold(*SIMULATION_GC_THRESHOLDS)


@contextmanager
def garbage_collected_rarely() -> Iterator[None]:
    """`collect_garbage_rarely` for a while in this process; the collector's settings come back after."""
    thresholds = gc.get_threshold()
    collect_garbage_rarely()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _run_in_worker(run_cell: CellRunner, args, cell) -> dict:
    return run_on_fresh_stack(run_cell, args, cell, _worker_progress)


def run_on_fresh_stack(run_cell: CellRunner, args, cell, progress) -> dict:
    """One cell on a simulation of its own, closed afterwards."""
    from specscale_lab.bench.runs import open_testbed

    stack = open_testbed(args)
    try:
        return run_cell(stack, args, cell, progress)
    finally:
        stack.close()


class CellPool:
    """Runs cells in `workers` processes (1: in this process); results in the order of the cells given."""

    def __init__(self, workers: int):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers

    def run(self, run_cell: CellRunner, args, cells: list, bar, label: Callable[[Any], str] = str,
            weight: Callable[[Any], float] | None = None) -> list[dict]:
        """bar: a tqdm bar advanced by finished requests; its postfix names the cell running (one process)
        or counts the cells done (K workers). weight: a cell's expected cost; K workers take the heaviest
        cells first, so no long cell starts last while the other workers idle."""
        lines = CellLines(len(cells), drawn=not bar.disable)
        if self.workers == 1:
            return self._run_here(run_cell, args, cells, bar, label, lines)
        order = sorted(range(len(cells)), key=lambda i: -weight(cells[i])) if weight else range(len(cells))
        return self._run_parallel(run_cell, args, cells, list(order), bar, lines)

    def _run_here(self, run_cell: CellRunner, args, cells: list, bar, label: Callable[[Any], str],
                  lines: CellLines) -> list[dict]:
        records = []
        with garbage_collected_rarely():
            for cell in cells:
                bar.set_postfix_str(label(cell))
                records.append(run_on_fresh_stack(run_cell, args, cell, bar))
                lines.cells_done(len(records))
        return records

    def _run_parallel(self, run_cell: CellRunner, args, cells: list, order: list[int], bar,
                      lines: CellLines) -> list[dict]:
        context = multiprocessing.get_context("spawn")  # no forked torch state or tqdm threads in workers
        finished_requests = context.Value("q", 0)
        workers = min(self.workers, len(cells))
        earlier_children = set(multiprocessing.active_children())
        pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                   initargs=(finished_requests,))
        try:
            with sigint_ignored():  # the workers, started by the first submits, inherit it
                futures = {pool.submit(_run_in_worker, run_cell, args, cells[i]): i for i in order}
            return self._collect(futures, len(cells), finished_requests, bar, workers, lines)
        except BaseException:
            stop_processes(set(multiprocessing.active_children()) - earlier_children)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _collect(self, futures: dict[Future, int], cells: int, finished_requests, bar, workers: int,
                 lines: CellLines) -> list[dict]:
        """Wait for every cell, advancing the bar; an interrupt says how many cells were done."""
        pending: set[Future] = set(futures)
        try:
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_POLL_S, return_when=FIRST_COMPLETED)
                bar.update(finished_requests.value - bar.n)
                bar.set_postfix_str(f"{cells - len(pending)}/{cells} cells done, {workers} workers")
                lines.cells_done(cells - len(pending))
        except KeyboardInterrupt as interrupt:
            interrupt.args = (f"after {cells - len(pending)} of {cells} cells",)
            raise
        records: list[dict] = [{}] * cells
        for future, i in futures.items():
            records[i] = future.result()  # a worker's error is raised here
        return records


class CellLines:
    """Where no bar is drawn: a line when the run starts, then one per finished cell (elapsed, ETA at the
    pace so far), on stderr."""

    def __init__(self, total: int, drawn: bool, stream=None, clock=time.monotonic):
        self.total, self.drawn = total, drawn
        self.stream = stream or sys.stderr
        self.clock = clock
        self.started = clock()
        self.reported = 0
        self._print(f"{total} cells to run")

    def cells_done(self, done: int) -> None:
        if done > self.reported:
            self.reported = done
            elapsed = self.clock() - self.started
            eta = elapsed / done * (self.total - done)
            self._print(f"cell {done} of {self.total} done, elapsed {tqdm.format_interval(elapsed)}, "
                        f"ETA {tqdm.format_interval(eta)}")

    def _print(self, text: str) -> None:
        if not self.drawn:
            print(text, file=self.stream, flush=True)


@contextmanager
def sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while the block runs: processes started in it inherit that, so Ctrl-C
    at the terminal reaches the parent only, and the parent stops them."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_processes(processes: set) -> None:
    """Terminate the processes and wait for them to exit (killed past WORKER_STOP_S)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(WORKER_STOP_S)
        if process.is_alive():
            process.kill()
            process.join()
