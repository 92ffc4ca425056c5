"""`specscale bench`: every sub-command's quick mode end to end on tiny random models (so the test does
not depend on the toy models' quality), writing sane JSON, Markdown and PNG; plus the pure helpers
(interleaving, paired differences, arrivals, sustainable rate, prefix sharing)."""

import argparse
import json
import math
import shlex
from itertools import pairwise

import pytest
import torch

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from specscale.cli import build_parser, main
from specscale_lab.bench import SUBCOMMANDS
from specscale_lab.bench.accuracy import paired_difference
from specscale_lab.bench.arguments import LADDER
from specscale_lab.bench.characterize import linear_fit, shared_tokens
from specscale_lab.bench.latency import arrival_times, sustainable_rate
from specscale_lab.bench.numbers import median_summary, percentile
from specscale_lab.bench.outputs import command_line
from specscale_lab.bench.runs import interleaved, paired_seed

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    generator = build_stepping_generator(tmp_path_factory.mktemp("bench-gen"))
    prm = build_qwen_prm_checkpoint(tmp_path_factory.mktemp("bench-prm"))
    return ["--generator", str(generator), "--prm", str(prm), "--threads", "1", "--kv-gb", "0.1",
            "--prm-kv-gb", "0.1", "--lv-threshold", "256"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_quick(command: str, models, out, *extra) -> dict:
    assert main(["bench", command, "--quick", "--out", str(out), *models, *extra]) == 0
    name = command
    summary = json.loads((out / "summary.json").read_text())
    raw = json.loads((out / "raw.json").read_text())
    markdown = (out / f"{name}.md").read_text()
    assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    run = summary["run"]
    assert run["command"].startswith(f"specscale bench {command} ") and "--quick" in run["command"]
    assert run["machine"]["cpu_count"] >= 1 and run["machine"]["torch_threads"] == 1
    assert "git_commit" in run and run["duration_s"] > 0
    assert raw["runs"] and f"specscale bench {command}" in markdown and "| ---" in markdown
    assert f"![{name}]({name}.png)" in markdown
    return summary


def test_full_runs_cover_the_baselines():
    from specscale_lab.bench import accuracy, throughput

    assert {"dvts", "fasttts", "fasttts-xb", "beam+cd", "ep+cd", "specscale"} <= set(accuracy.FULL["variants"])
    assert {"fasttts", "fasttts-xb"} <= set(throughput.FULL["variants"])  # best-of-n: accuracy's reference


def test_every_subcommand_is_registered():
    assert {"throughput", "latency", "accuracy", "characterize", "sweep_lv", "scaling"} <= set(SUBCOMMANDS)
    choices = build_parser()._subparsers._group_actions[0].choices["bench"]._subparsers._group_actions[0].choices
    assert {"throughput", "latency", "accuracy", "characterize", "sweep-lv", "scaling"} <= set(choices)


def test_throughput_quick(models, tmp_path):
    summary = run_quick("throughput", models, tmp_path)
    results = summary["results"]
    assert set(results) == set(LADDER)
    for variant in LADDER:
        for n in ("4", "8"):
            cell = results[variant][n]
            assert cell["output_tokens_per_s"] > 0 and cell["generated_tokens_per_s"] > 0
            assert cell["requests_per_s"] > 0 and len(cell["output_tokens_per_s_repeats"]) == 3
            assert 0 <= cell["accuracy"] <= 1
    for run in json.loads((tmp_path / "raw.json").read_text())["runs"]:  # medians of a cell need not add up
        assert run["generation_s"] + run["verification_s"] <= run["elapsed_s"] * 1.01
    assert {(s["ratio"], s["beam_size"]) for s in summary["speedups"]} >= {("specscale / beam", 8),
                                                                          ("specscale / beam", 4)}
    assert "Targets" in (tmp_path / "throughput.md").read_text()


def test_latency_quick(models, tmp_path):
    summary = run_quick("latency", models, tmp_path)
    assert summary["capacity_requests_per_s"] > 0 and len(summary["rates"]) == 2
    for variant in ("beam", "specscale"):
        cell = summary["results"][variant]["4"]
        assert [p["rate"] for p in cell["rates"]] == summary["rates"]
        for point in cell["rates"]:
            assert 0 < point["p50_s"] <= point["p90_s"] <= point["p99_s"]
            assert point["mean_normalized_ms_per_token"] > 0
        assert cell["max_sustainable_rate"] in (None, *summary["rates"])


def test_accuracy_quick(models, tmp_path):
    summary = run_quick("accuracy", models, tmp_path)
    results = summary["results"]
    assert set(results) == {"beam", "naive-spec", "specscale", "best-of-n", "single-sample"}
    diff = results["specscale"]["4"]["difference_to_beam"]
    assert diff["ci95_low"] <= diff["mean"] <= diff["ci95_high"] and diff["problems"] == 6 and diff["seeds"] == 2
    assert "gain_over_single_sample" in results["beam"]["4"]
    assert 0 <= results["naive-spec"]["4"]["same_best_path_as_beam"] <= 1
    for by_size in results.values():
        for cell in by_size.values():
            assert 0 <= cell["best_accuracy"] <= 1 and 0 <= cell["majority_vote_accuracy"] <= 1
            assert cell["peak_kv_blocks"] > 0  # the most generator KV blocks a run held at once (median)
    runs = json.loads((tmp_path / "raw.json").read_text())["runs"]
    seeds = {(r["variant"], r["seed"]) for r in runs}
    assert len(seeds) == 5 * 2 and all(r["peak_kv_blocks"] > 0 for r in runs)
    assert "CD pairing" in (tmp_path / "accuracy.md").read_text()  # specscale's share of beam's paths


def test_characterize_quick(models, tmp_path):
    summary = run_quick("characterize", models, tmp_path)
    cell = summary["results"]["specscale"]["4"]
    shares = cell["generation_share"] + cell["verification_share"] + cell["other_share"]
    assert shares == pytest.approx(1.0, abs=0.02)
    assert cell["verifier_calls"] > 0 and cell["iterations"] > 0 and cell["prm_tokens_per_s"] > 0
    assert 0 < cell["physical_to_logical"] <= 1
    assert cell["live_sequences_mean"] >= cell["rows_per_iteration_mean"] > 0  # what specscale_lab/calibration/cpu_fit.py splits by
    waiting = summary["waiting_batch_size_1"]
    assert 0 <= waiting["overall"] <= 1 and waiting["by_events"]
    prefix = summary["common_prefix"]
    assert 0 <= prefix["token_weighted"] < 1 and prefix["groups"] > 0
    scores = summary["prm_scores"]
    assert scores["scores"] == sum(scores["counts"]) > 0 and 0 <= scores["fraction_exactly_1"] <= 1
    profile = summary["profile"]
    assert sum(profile["self_time_share_by_area"].values()) == pytest.approx(1.0)
    assert profile["top_functions"]


def test_sweep_lv_quick(models, tmp_path):
    summary = run_quick("sweep-lv", models, tmp_path)
    labels = set(summary["results"])
    assert labels == {"ep+cd", "specscale lv=256 defer=6", "specscale lv=2048 defer=6", "specscale lv=256 defer=0"}
    assert summary["results"]["specscale lv=256 defer=6"]["4"]["sweeps"] == ["threshold", "deferral_cap"]
    for by_size in summary["results"].values():
        assert by_size["4"]["output_tokens_per_s"] > 0 and by_size["4"]["verifier_calls"] > 0


def test_scaling_quick(models, tmp_path):
    summary = run_quick("scaling", models, tmp_path)
    for variant in ("beam", "specscale"):
        assert set(summary["results"][variant]["4"]["concurrency"]) == {"2", "4"}
        assert set(summary["results"][variant]["8"]["concurrency"]) == {"4"}
        for sweep in summary["results"][variant].values():
            for cell in sweep["concurrency"].values():
                assert 0 < cell["peak_kv_blocks"] <= summary["kv_blocks_total"]
                assert cell["output_tokens_per_s"] > 0


# ---- helpers ------------------------------------------------------------------------------------------
def test_interleaved_rotates_and_covers_every_cell_each_repeat():
    order = list(interleaved(["a", "b", "c"], 4))
    assert [cell for _, cell in order] == list("abc" "bca" "cab" "abc")
    assert [repeat for repeat, _ in order] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3


def test_paired_seed_depends_on_seed_and_problem_only():
    assert paired_seed(0, 5) == paired_seed(0, 5) != paired_seed(1, 5)
    assert len({paired_seed(s, i) for s in range(3) for i in range(300)}) == 900


def test_paired_difference_averages_seeds_per_problem():
    a = {0: [1, 1, 0, 1], 1: [1, 0, 0, 1]}
    b = {0: [1, 0, 0, 0], 1: [1, 0, 1, 0]}
    diff = paired_difference(a, b)
    per_problem = [0.0, 0.5, -0.5, 1.0]
    assert diff["mean"] == pytest.approx(sum(per_problem) / 4)
    sd = math.sqrt(sum((x - 0.25) ** 2 for x in per_problem) / 3)
    assert diff["half_width"] == pytest.approx(1.959964 * sd / 2, rel=1e-5)


def test_arrival_times_have_the_requested_rate():
    times = arrival_times(20_001, rate=4.0, burstiness=1.0, seed=[0])
    assert times[0] == 0.0 and all(b >= a for a, b in pairwise(times))
    assert 20_000 / times[-1] == pytest.approx(4.0, rel=0.03)
    gaps = [b - a for a, b in pairwise(times)]
    bursty = arrival_times(20_001, rate=4.0, burstiness=0.25, seed=[0])
    bursty_gaps = [b - a for a, b in pairwise(bursty)]
    assert percentile(bursty_gaps, 50) < percentile(gaps, 50)  # same mean, more small gaps


def test_sustainable_rate_stops_at_the_first_rate_over_budget():
    points = [{"rate": r, "mean_normalized_ms_per_token": ms, "mean_queued_s": 0.0, "p50_s": 10.0}
              for r, ms in ((1, 1.0), (2, 3.0), (3, 1.5))]
    assert sustainable_rate(points, budget=2.0) == 1
    assert sustainable_rate(points, budget=0.5) is None
    assert sustainable_rate(points, budget=5.0) == 3


def test_a_rate_whose_arrivals_queue_for_admission_is_not_sustained_even_under_budget():
    points = [{"rate": r, "mean_normalized_ms_per_token": 1.0, "mean_queued_s": q, "p50_s": 10.0}
              for r, q in ((1, 0.0), (2, 0.5), (3, 4.0), (4, 9.0))]  # saturated from rate 3: the queue grows
    assert sustainable_rate(points, budget=5.0) == 2
    assert sustainable_rate(points, budget=5.0, max_queued_share=0.5) == 3


def test_shared_tokens_counts_a_token_trie():
    assert shared_tokens([[1, 2, 3], [1, 2, 4], [1, 5]]) == (3, 8)  # nodes: 1, 12, 123, 124, 15
    assert shared_tokens([[1], [2]]) == (0, 2)


def test_linear_fit_recovers_fixed_and_per_row_cost():
    points = [(rows, 0.002 + 0.0005 * rows) for rows in (1, 2, 4, 8, 16) for _ in range(3)] + [(4, 1.0)]
    fixed, per_row = linear_fit(points)  # one slow outlier does not move the per-size medians
    assert fixed == pytest.approx(0.002, abs=1e-6) and per_row == pytest.approx(0.0005, rel=1e-3)


def test_median_summary_and_command_line():
    assert median_summary([{"a": 1, "b": "x"}, {"a": 3, "b": "y"}, {"a": 2, "b": "z"}]) == {"a": 2}

    args = argparse.Namespace(out="o", quick=True, beam_sizes=[4, 8], threads=None, func=print)
    assert command_line("throughput", args) == "specscale bench throughput --beam-sizes 4,8 --out o --quick"


@pytest.mark.parametrize("switch", [[], ["--no-profile-prm"], ["--profile-prm"]])
def test_a_recorded_bench_command_parses_back_to_the_same_settings(switch):
    """The command a run records (its summary and report) replays as written; `sim_validation.py compare`
    parses it back. A switch on by default was recorded as an option the parser did not know."""
    words = ["bench", "throughput", "--out", "o", "--beam-sizes", "4,8", "--quick", *switch]
    args = build_parser().parse_args(words)
    recorded = shlex.split(command_line("throughput", args))
    again = build_parser().parse_args(recorded[1:])
    assert {k: v for k, v in vars(again).items() if k != "func"} == {k: v for k, v in vars(args).items() if k != "func"}
    assert again.profile_prm is (switch != ["--no-profile-prm"])


def test_only_variants_that_promise_beams_paths_are_held_to_the_pairing_target():
    from specscale_lab.bench.accuracy import promises_beams_paths

    held = {v for v in (*LADDER, "fasttts-db", "dvts", "best-of-n", "single-sample") if promises_beams_paths(v)}
    assert held == {"beam", "beam+cd", "beam+cd+lv", "specscale-nospec", "naive-spec", "ep-strict", "ep", "ep+cd",
                    "specscale"}


def test_a_run_header_names_every_kernel_path_each_model_took():
    from specscale_lab.bench.outputs import kernels_markdown

    report = {"linear_paths": {"onednn": 20}, "attention": "cpp", "prefill_attention": "torch"}
    text = kernels_markdown({"machine": {"isa": "Test CPU (AMX)"}, "kernels": {"generator": report, "prm": report}})
    assert text.startswith("Machine: Test CPU (AMX).")
    assert text.count("attention cpp, prefill attention torch") == 2 and "{'onednn': 20}" in text
