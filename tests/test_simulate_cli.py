"""`specscale simulate <benchmark>` and `specscale trace` end to end (docs/simulator.md): the bench
sub-commands on the simulator write the bench outputs (summary.json with results[variant][beam_size]),
the same seed gives the same summary, `specscale bench ... --backend sim` is the same code path, the
open-loop latency benchmark runs on the virtual clock (no sleeping), and a recorded trace round-trips into
`--workload`."""

import json
import time

import pytest
import torch

from checkpoints import build_qwen_prm_checkpoint, build_stepping_generator
from specscale.cli import build_parser, main
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.sim.workload import TOY, preset
from specscale_lab.calibration.trace import read_trace
from specscale_lab.calibration.workload_choice import choose_workload
from specscale_lab.simulate import SIMULATED_BENCHMARKS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
A100 = ["--hardware", "a100-80gb", "--generator", "qwen2.5-7b-instruct", "--prm", "qwen2.5-math-prm-7b"]
SMALL = ["--problems", "3", "--beam-sizes", "4", "--max-rounds", "6", "--max-concurrency", "3"]


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def simulate(out, command: str, *options) -> dict:
    assert main(["simulate", command, "--out", str(out), *options]) == 0
    assert (out / f"{command}.png").read_bytes()[:8] == PNG_MAGIC
    assert json.loads((out / "raw.json").read_text())["runs"]
    markdown = (out / f"{command}.md").read_text()
    assert markdown.startswith(f"# specscale simulate {command}") and "**Simulated**" in markdown
    return json.loads((out / "summary.json").read_text())


def simulated(results: dict) -> dict:
    """A summary's cells without what the machine, not the simulation, decides (the load average)."""
    return {variant: {n: {k: v for k, v in cell.items() if k != "load_before"} for n, cell in by_size.items()}
            for variant, by_size in results.items()}


def test_every_simulated_benchmark_is_registered():
    choices = build_parser()._subparsers._group_actions[0].choices["simulate"]._subparsers._group_actions[0].choices
    assert set(choices) == {"throughput", "latency", "sweep-lv", "scaling", "characterize"}
    assert len(SIMULATED_BENCHMARKS) == len(choices)
    args = build_parser().parse_args(["simulate", "throughput", "--out", "x", "--presets", "beam,ep"])
    assert (args.backend, args.hardware, args.generator, args.variants) == ("sim", "a100-80gb",
                                                                           "qwen2.5-7b-instruct", ["beam", "ep"])


def test_simulated_throughput_writes_the_bench_summary_and_is_deterministic(tmp_path):
    started = time.perf_counter()
    options = [*SMALL, "--presets", "beam,specscale", "--seed", "3"]
    first = simulate(tmp_path / "a", "throughput", *options)
    assert time.perf_counter() - started < 60
    run = first["run"]
    assert run["backend"] == "sim" and run["hardware"]["name"] == "a100-80gb"
    assert run["models"] == {"generator": "qwen2.5-7b-instruct", "prm": "qwen2.5-math-prm-7b",
                             "prm_format": "qwen-math-prm"}
    assert run["workload"]["name"] == "math500/qwen2.5-7b-instruct/qwen2.5-math-prm-7b"
    assert run["command"].startswith("specscale simulate throughput ") and "--repeats 1" in run["command"]
    for variant in ("beam", "specscale"):
        cell = first["results"][variant]["4"]
        assert cell["output_tokens_per_s"] > 0 and cell["generated_tokens"] > 0 and 0 <= cell["accuracy"] <= 1
        assert cell["other_s"] == pytest.approx(0.0, abs=1e-6)  # host work costs no simulated time
        assert cell["generation_s"] + cell["verification_s"] == pytest.approx(cell["elapsed_s"], rel=1e-6)
    again = simulate(tmp_path / "b", "throughput", *options)
    assert simulated(again["results"]) == simulated(first["results"]) and again["speedups"] == first["speedups"]
    other = simulate(tmp_path / "c", "throughput", *SMALL, "--presets", "beam,specscale", "--seed", "4")
    assert simulated(other["results"]) != simulated(first["results"])


def test_bench_backend_sim_is_the_same_code_path(tmp_path):
    options = [*SMALL, "--presets", "beam", *A100]
    summary = simulate(tmp_path / "sim", "throughput", *options)
    assert main(["bench", "throughput", "--backend", "sim", "--out", str(tmp_path / "bench"), *options]) == 0
    bench = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert simulated(bench["results"]) == simulated(summary["results"])
    assert bench["run"]["command"].startswith("specscale bench throughput ")


def test_simulated_latency_runs_open_loop_on_the_virtual_clock(tmp_path):
    started = time.perf_counter()
    summary = simulate(tmp_path, "latency", *SMALL, "--presets", "beam", "--rates", "0.01,1")
    assert time.perf_counter() - started < 60  # 3 arrivals 100 simulated seconds apart: no real sleeping
    points = summary["results"]["beam"]["4"]["rates"]
    assert [p["rate"] for p in points] == [0.01, 1.0]
    slow, fast = points
    assert 0 < slow["p50_s"] <= slow["p99_s"] and slow["mean_queued_s"] == pytest.approx(0.0, abs=1e-9)
    assert fast["p90_s"] >= slow["p90_s"]  # arrivals 1 s apart wait for each other's work


def test_simulated_scaling_reports_the_simulated_kv_pool(tmp_path):
    summary = simulate(tmp_path, "scaling", "--beam-sizes", "4", "--concurrencies", "2", "--max-concurrency", "2",
                       "--waves", "1", "--max-rounds", "4", "--presets", "beam")
    assert summary["kv_blocks_total"] == summary["run"]["kv_blocks"] > 30_000  # A100 memory after both models
    assert 0 < summary["results"]["beam"]["4"]["concurrency"]["2"]["peak_kv_blocks"]


def test_a_simulated_trace_feeds_the_workload_of_a_simulation(tmp_path):
    trace = tmp_path / "trace.jsonl"
    assert main(["trace", "--backend", "sim", *A100, "--problems", "16", "--beam-size", "4", "--out", str(trace)]) == 0
    header, requests = read_trace(trace)
    assert header.source == "simulated" and header.generator == "qwen2.5-7b-instruct"
    assert header.search["beam_size"] == 4 and len(requests) == 16
    assert all(any(s.completed for s in r.steps) for r in requests)
    assert all(r.gold is not None and r.correct is not None for r in requests)
    summary = simulate(tmp_path / "replay", "throughput", *SMALL, "--presets", "beam", "--workload", str(trace))
    workload = summary["run"]["workload"]
    assert workload["name"].endswith("fitted")
    assert "fitted from a trace of 16 requests" in workload["sources"]["step_tokens_median"]


def test_a_real_run_records_a_trace(tmp_path):
    generator = build_stepping_generator(tmp_path / "gen")
    prm = build_qwen_prm_checkpoint(tmp_path / "prm")
    trace = tmp_path / "real.jsonl"
    assert main(["trace", "--generator", str(generator), "--prm", str(prm), "--threads", "1", "--kv-gb", "0.1",
                 "--prm-kv-gb", "0.1", "--problems", "2", "--beam-size", "4", "--max-rounds", "3",
                 "--out", str(trace)]) == 0
    header, requests = read_trace(trace)
    assert header.source == "real" and header.generator == str(generator.resolve())
    assert [r.request_id for r in requests] == ["q0", "q1"]
    for request in requests:
        assert request.prompt_tokens > request.question_tokens > 0 and len(request.steps) >= 4
        assert all(s.step_tokens and s.token_ids for s in request.steps)


def test_simulated_characterize_measures_the_simulated_device(tmp_path):
    summary = simulate(tmp_path, "characterize", "--problems", "2", "--waiting-problems", "2", "--presets", "beam",
                       "--beam-sizes", "4", "--max-rounds", "4", "--profile-variant", "")
    cell = summary["results"]["beam"]["4"]
    hardware, model = HardwareProfile.load("a100-80gb"), ModelProfile.load("qwen2.5-7b-instruct")
    weights_s = (model.body_weight_bytes + model.head_weight_bytes) / hardware.achievable_bandwidth
    # the fitted fixed cost of a decode iteration is the roofline's: fixed cost + reading the weights once + the
    # layers' kernels
    kernels_s = model.num_layers * hardware.layer_kernel_s
    assert cell["iteration_fixed_ms"] == pytest.approx(1000 * (hardware.iteration_fixed_s + weights_s + kernels_s),
                                                       rel=0.03)
    assert cell["iteration_per_row_ms"] < 0.05  # an extra decode row rides along almost free
    assert cell["prm_call_fixed_ms"] >= 1000 * hardware.prm_iteration_fixed_s
    assert summary["waiting_batch_size_1"]["difficulty"] == "level"


def test_the_workload_choice_names_its_stand_ins(tmp_path):
    own = choose_workload("math500", "my-finetune", "qwen2.5-math-prm-7b")
    assert own.accuracy == preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b").accuracy
    assert "my-finetune has no preset" in own.sources["models"]
    assert choose_workload("toy", "toy-generator", "toy-prm") == TOY
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(TOY.to_json()))
    assert choose_workload("math500", "qwen2.5-3b-instruct", "qwen2.5-math-prm-7b", str(path)) == TOY
    with pytest.raises(FileNotFoundError, match="no workload file"):
        choose_workload("math500", "qwen2.5-3b-instruct", "qwen2.5-math-prm-7b", str(tmp_path / "missing.jsonl"))


def test_open_loop_waits_reach_each_arrival_late_on_the_virtual_clock():
    from specscale.sim.simulation import Simulation, SimulationConfig
    from specscale_lab.bench.latency import serve_open_loop
    from specscale_lab.bench.runs import search_requests
    from specscale_lab.bench.testbed import SimulatedTestbed

    stack = SimulatedTestbed(Simulation(SimulationConfig()))
    stack.clock.advance(116.13370459400056)  # where an earlier run left it: (start + gap) - start < gap here
    problems = stack.problems(2)
    requests = search_requests(stack, problems, "beam", 0, beam_size=4, beam_width=4, max_rounds=2)

    class Bar:
        def update(self, _):
            pass

    arrivals = [25.32699453496304, 30.0]  # waiting by the gap (clock += gap) would stop an ulp short: a spin
    latencies, _ = serve_open_loop(stack, 2, requests, arrivals, Bar())
    assert [r["arrival_s"] for r in latencies] == arrivals
    assert all(r["latency_s"] > 0 for r in latencies)
    stack.close()
