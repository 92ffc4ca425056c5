"""CellPool: the cells of a simulated benchmark run, each on a fresh simulation, in K worker processes.

A simulated cell (one variant at one beam size, one repeat) is a deterministic function of the options and
the cell alone when it runs on a simulation of its own: the virtual clock starts at 0 and both KV pools and
prefix caches start empty, so no cell inherits another's clock offset or cached prompt blocks. That makes
the cells independent, and `--workers K` runs them in K processes with the very results one process gives
(docs/simulator.md, "Speed"). Real runs share one pipeline and run one cell at a time: their timings are wall
seconds, which parallel cells would distort.

`run_cell(stack, args, cell, progress)` is a module-level function (workers import it by name) that serves
one cell on `stack` and returns its record; `progress.update(n)` is told of finished requests.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any

# A simulation allocates millions of short-lived objects (rows, outputs, updates): with the default
# thresholds (700, 10, 10) the cyclic collector ran ~700 times in two N = 8 cells and took ~12% of their
# CPU time, mostly rescanning the long-lived imports; frozen imports and a larger first generation cut
# that to ~2%. Collection order does not affect any simulated result.
SIMULATION_GC_THRESHOLDS = (20_000, 20, 20)
MAX_DEFAULT_WORKERS = 2  # the default: min(this, cells, CPUs); more only when asked for
PROGRESS_POLL_S = 0.2  # how often the parent reads the workers' progress

CellRunner = Callable[..., dict]  # run_cell(stack: BenchStack, args, cell, progress) -> the cell's record


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
    from specscale_lab.bench.common import open_stack

    stack = open_stack(args)
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
        if self.workers == 1:
            records = []
            with garbage_collected_rarely():
                for cell in cells:
                    bar.set_postfix_str(label(cell))
                    records.append(run_on_fresh_stack(run_cell, args, cell, bar))
            return records
        order = sorted(range(len(cells)), key=lambda i: -weight(cells[i])) if weight else range(len(cells))
        return self._run_parallel(run_cell, args, cells, list(order), bar)

    def _run_parallel(self, run_cell: CellRunner, args, cells: list, order: list[int], bar) -> list[dict]:
        context = multiprocessing.get_context("spawn")  # no forked torch state or tqdm threads in workers
        finished_requests = context.Value("q", 0)
        workers = min(self.workers, len(cells))
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                 initargs=(finished_requests,)) as pool:
            futures = {pool.submit(_run_in_worker, run_cell, args, cells[i]): i for i in order}
            pending: set[Future] = set(futures)
            while pending:
                _, pending = wait(pending, timeout=PROGRESS_POLL_S, return_when=FIRST_COMPLETED)
                bar.update(finished_requests.value - bar.n)
                bar.set_postfix_str(f"{len(cells) - len(pending)}/{len(cells)} cells done, {workers} workers")
            records: list[dict] = [{}] * len(cells)
            for future, i in futures.items():
                records[i] = future.result()  # a worker's error is raised here
        return records
