"""`specscale bench throughput` / `specscale simulate throughput` with `--max-concurrency 1,2,4,8,32`: the load
sweep (issue 44 §4). Every level's runs use that level's concurrency and problem count, one table carries a
column group per level, the ratios are medians of per-repeat ratios, one level writes what it always did, and
bad levels or counts end in one line (exit 2) naming the flag."""

import json
import shlex

import pytest
import torch

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from specscale.cli import build_parser, main
from specscale_lab.bench.outputs import command_line
from specscale_lab.bench.throughput import load_sweep, sweep_table

TINY = ["--beam-sizes", "4", "--max-rounds", "3", "--presets", "beam,specscale", "--seed", "2"]
SIMULATED = ["--hardware", "a100-80gb", "--generator", "qwen2.5-3b-instruct", "--prm", "qwen2.5-math-prm-7b",
             "--workers", "1"]
GROUP = " in flight: out tok/s"  # the first column of a level's group in the sweep table


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def outputs(out) -> tuple[dict, list[dict], str]:
    summary = json.loads((out / "summary.json").read_text())
    runs = json.loads((out / "raw.json").read_text())["runs"]
    return summary, runs, (out / "throughput.md").read_text()


def sweep_header(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("| variant | N |"))


def test_a_simulated_sweep_runs_every_level_at_its_concurrency_and_writes_one_table(tmp_path):
    assert main(["simulate", "throughput", "--out", str(tmp_path), *SIMULATED, *TINY,
                 "--max-concurrency", "1,3", "--problems", "2,3"]) == 0
    summary, runs, markdown = outputs(tmp_path)
    # each run ran on a runtime admitting the level's requests, on the level's problems
    assert sorted((r["max_concurrency"], r["problems"], r["variant"]) for r in runs) == [
        (1, 2, "beam"), (1, 2, "specscale"), (3, 3, "beam"), (3, 3, "specscale")]
    sweep = summary["load_sweep"]
    assert sweep["levels"] == [1, 3] and sweep["problems"] == [2, 3] and sweep["reference"] == "beam"
    assert set(summary["results"]) == {"1", "3"} and set(summary["speedups"]) == {"1", "3"}
    assert set(summary["results"]["3"]) == {"beam", "specscale"}
    assert "--max-concurrency 1,3" in summary["run"]["command"] and "--problems 2,3" in summary["run"]["command"]
    # one table: a column group per level, a row per variant, the ratios to beam
    header = sweep_header(markdown)
    assert header.count(GROUP) == 2 and "| 1" + GROUP in header and "| 3" + GROUP in header
    assert markdown.count("| variant | N |") == 1
    rows = {row["variant"]: row["levels"] for row in sweep["rows"]}
    assert set(rows) == {"beam", "specscale"}
    for level in ("1", "3"):
        assert rows["beam"][level]["output_tokens_per_s_ratio"] == 1.0
        mine = {r["variant"]: r for r in runs if r["max_concurrency"] == int(level)}
        assert rows["specscale"][level]["output_tokens_per_s_ratio"] == pytest.approx(
            mine["specscale"]["output_tokens_per_s"] / mine["beam"]["output_tokens_per_s"])
        assert rows["specscale"][level]["requests_per_s_ratio"] == pytest.approx(
            mine["specscale"]["requests_per_s"] / mine["beam"]["requests_per_s"])
    # more load serves more requests per second on the simulated A100
    assert rows["beam"]["3"]["requests_per_s"] > rows["beam"]["1"]["requests_per_s"]
    assert "## At most 1 in flight (2 problems)" in markdown and "## At most 3 in flight (3 problems)" in markdown


def test_one_problem_count_serves_every_level(tmp_path):
    assert main(["bench", "throughput", "--backend", "sim", "--out", str(tmp_path), *SIMULATED, *TINY,
                 "--presets", "specscale,beam+cd", "--max-concurrency", "2,1", "--problems", "2"]) == 0
    summary, runs, markdown = outputs(tmp_path)
    assert {(r["max_concurrency"], r["problems"]) for r in runs} == {(2, 2), (1, 2)}
    assert summary["load_sweep"]["levels"] == [2, 1]
    assert summary["load_sweep"]["reference"] == "specscale"  # no beam: the first variant
    assert sweep_header(markdown).index("| 2" + GROUP) < sweep_header(markdown).index("| 1" + GROUP)


def test_one_level_writes_the_single_run_outputs(tmp_path):
    assert main(["simulate", "throughput", "--out", str(tmp_path), *SIMULATED, *TINY,
                 "--max-concurrency", "2", "--problems", "2"]) == 0
    summary, runs, markdown = outputs(tmp_path)
    assert "load_sweep" not in summary and set(summary["results"]) == {"beam", "specscale"}
    assert all("max_concurrency" not in r for r in runs) and GROUP not in markdown
    args = build_parser().parse_args(["bench", "throughput", "--out", "x", "--max-concurrency", "8", "--problems", "16"])
    assert (args.max_concurrency, args.problems) == (8, 16)  # one level parses as it always did: an int
    args = build_parser().parse_args(["bench", "throughput", "--out", "x", "--max-concurrency", "1,8"])
    assert args.max_concurrency == [1, 8]


def run(kind: str, backend: str, metric: str, repeat: int, value: float, level: int = 4) -> dict:
    return {"variant": kind, "beam_size": 8, "repeat": repeat, "max_concurrency": level, backend: value,
            metric: value}


def test_sweep_ratios_are_medians_of_per_repeat_ratios():
    # per-repeat specscale / beam: 2.0, 0.5, 1.5 -> median 1.5; the ratio of the medians would be 2/2 = 1.0
    beam, fast = [1.0, 4.0, 2.0], [2.0, 2.0, 3.0]
    runs = [{"variant": v, "beam_size": 8, "repeat": i, "max_concurrency": 4,
             "output_tokens_per_s": rate, "requests_per_s": rate * 10}
            for v, rates in (("beam", beam), ("specscale", fast)) for i, rate in enumerate(rates)]
    sweep = load_sweep(runs, [4], [16], [("beam", 8), ("specscale", 8)], 3, "beam")
    cell = sweep["rows"][1]["levels"]["4"]
    assert sweep["rows"][1]["variant"] == "specscale"
    assert cell["output_tokens_per_s_ratio"] == pytest.approx(1.5)
    assert cell["output_tokens_per_s_ratio_repeats"] == pytest.approx([2.0, 0.5, 1.5])
    assert cell["requests_per_s_ratio"] == pytest.approx(1.5) and cell["output_tokens_per_s"] == 2.0
    assert "| specscale | 8 | 2.00 | 1.50 | 1.50 |" in sweep_table(sweep)


@pytest.mark.parametrize("options, flag", [
    (["--max-concurrency", "0"], "--max-concurrency 0"),
    (["--max-concurrency", "1,2,-4"], "--max-concurrency 1,2,-4"),
    (["--max-concurrency", "2.5"], "--max-concurrency 2.5"),
    (["--max-concurrency", "1,,8"], "--max-concurrency 1,,8"),
    (["--max-concurrency", "4,4"], "--max-concurrency 4,4"),
    (["--problems", "0"], "--problems 0"),
    (["--problems", "8,x"], "--problems 8,x"),
    (["--max-concurrency", "1,2,4", "--problems", "8,16"], "--problems 8,16"),
    (["--problems", "8,16"], "--problems 8,16"),
    (["--repeats", "0"], "--repeats 0"),
])
@pytest.mark.parametrize("command", [["simulate", "throughput"], ["bench", "throughput", "--backend", "sim"]])
def test_bad_levels_and_counts_end_in_one_line_naming_the_flag(command, options, flag, tmp_path, capsys):
    assert main([*command, "--out", str(tmp_path), *options]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"specscale {command[0]} throughput: error: {flag}: "), lines
    assert not (tmp_path / "summary.json").exists()


def test_other_bench_commands_take_one_positive_concurrency(tmp_path, capsys):
    assert main(["bench", "latency", "--out", str(tmp_path), "--max-concurrency", "1,2"]) == 2
    assert main(["bench", "latency", "--out", str(tmp_path), "--max-concurrency", "0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(": error: --max-concurrency " in line for line in lines), lines


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("sweep-gen"))
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("sweep-prm"))
    return ["--generator", str(generator), "--prm", str(prm), "--threads", "1", "--kv-gb", "0.1",
            "--prm-kv-gb", "0.1", "--lv-threshold", "256"]


def test_a_sweep_on_checkpoints_runs_each_level_at_its_concurrency(models, tmp_path):
    assert main(["bench", "throughput", "--out", str(tmp_path), *models, *TINY, "--repeats", "2",
                 "--max-concurrency", "1,2", "--problems", "2"]) == 0
    summary, runs, markdown = outputs(tmp_path)
    assert sorted({(r["max_concurrency"], r["problems"]) for r in runs}) == [(1, 2), (2, 2)]
    assert len(runs) == 2 * 2 * 2  # levels x variants x repeats
    cell = next(row for row in summary["load_sweep"]["rows"] if row["variant"] == "specscale")["levels"]["2"]
    assert len(cell["output_tokens_per_s_ratio_repeats"]) == 2 and cell["output_tokens_per_s"] > 0
    assert sweep_header(markdown).count(GROUP) == 2


def test_a_recorded_sweep_command_parses_back_to_the_same_levels():
    args = build_parser().parse_args(["bench", "throughput", "--out", "o", "--max-concurrency", "1,2,4,8,32",
                                      "--problems", "16,16,32,64,64"])
    recorded = command_line("throughput", args)
    assert "--max-concurrency 1,2,4,8,32" in recorded and "--problems 16,16,32,64,64" in recorded
    again = build_parser().parse_args(shlex.split(recorded)[1:])
    assert (again.max_concurrency, again.problems) == ([1, 2, 4, 8, 32], [16, 16, 32, 64, 64])
