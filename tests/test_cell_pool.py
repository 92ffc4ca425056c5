"""The simulated ladder's cells are independent (bench/cell_pool.py): each runs on a fresh simulation, so
a cell gives the same numbers alone, after other cells, or in another worker process, and `--workers K`
writes the very summary one process writes."""

import json

import pytest
import torch

from specscale.cli import build_parser, main
from specscale_lab.bench.cell_pool import default_workers, resolve_workers

SMALL = ["--problems", "3", "--beam-sizes", "4", "--max-rounds", "6", "--max-concurrency", "3", "--seed", "5"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def ladder(out, *options) -> tuple[dict, list[dict]]:
    """summary results and raw runs of `specscale simulate throughput`, without the machine's load average."""
    assert main(["simulate", "throughput", "--out", str(out), *SMALL, *options]) == 0
    summary = json.loads((out / "summary.json").read_text())
    runs = json.loads((out / "raw.json").read_text())["runs"]
    return strip_load(summary["results"]), strip_load(runs)


def strip_load(value):
    if isinstance(value, dict):
        return {k: strip_load(v) for k, v in value.items() if k != "load_before"}
    if isinstance(value, list):
        return [strip_load(v) for v in value]
    return value


def test_a_cell_does_not_depend_on_the_cells_before_it(tmp_path):
    # on one shared simulation, specscale's prompts hit the KV blocks beam's cell left cached, and its
    # clock starts where beam's stopped: its times came out shorter than alone
    alone, _ = ladder(tmp_path / "alone", "--presets", "specscale", "--workers", "1")
    after, _ = ladder(tmp_path / "after", "--presets", "beam,specscale", "--workers", "1")
    assert after["specscale"] == alone["specscale"]


def test_workers_write_the_summary_one_process_writes(tmp_path):
    options = ["--presets", "beam,beam+cd,specscale", "--beam-sizes", "4,8"]
    serial_results, serial_runs = ladder(tmp_path / "serial", *options, "--workers", "1")
    parallel_results, parallel_runs = ladder(tmp_path / "parallel", *options, "--workers", "2")
    assert parallel_results == serial_results
    assert parallel_runs == serial_runs  # records in the serial order, whatever order the workers finished in
    summary = json.loads((tmp_path / "parallel" / "summary.json").read_text())
    assert json.loads((tmp_path / "serial" / "summary.json").read_text())["speedups"] == summary["speedups"]


def test_workers_default_to_at_most_two_and_only_on_the_simulator():
    assert default_workers(1) == 1
    assert default_workers(18) == min(2, __import__("os").cpu_count() or 1)
    sim = build_parser().parse_args(["simulate", "throughput", "--out", "x"])
    assert resolve_workers(sim, 18) == default_workers(18)
    sim.workers = 3
    assert resolve_workers(sim, 18) == 3
    real = build_parser().parse_args(["bench", "throughput", "--out", "x"])
    assert resolve_workers(real, 18) == 1
    real.workers = 2
    with pytest.raises(SystemExit):
        resolve_workers(real, 18)
