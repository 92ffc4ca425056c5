"""The simulator's cost model: model shapes against published parameter counts, iteration times against
rooflines computed by hand, the PRM knee where the published fact puts it, KV capacity, every hardware
number with a source, and the CPU profile fitted from measurement files."""

import json
from dataclasses import replace

import pytest

from specscale.costmodel.cost import (
    IterationWork,
    RooflineCostModel,
    bytes_moved,
    flops,
    host_seconds,
    kv_capacity,
)
from specscale.costmodel.hardware import HardwareProfile, bundled_hardware
from specscale.costmodel.model_profile import ModelProfile, bundled_models
from specscale.engine.scheduler import ScheduledBatch, ScheduledRow
from specscale.engine.sequence import Sequence
from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale_lab.calibration.cpu_fit import fit_cpu_profile

A100 = HardwareProfile.load("a100-80gb")
QWEN_7B = ModelProfile.load("qwen2.5-7b-instruct")
QWEN_PRM = ModelProfile.load("qwen2.5-math-prm-7b")


@pytest.mark.parametrize("name,params", [  # the models' published totals (model cards / safetensors index)
    ("qwen2.5-7b-instruct", 7_615_616_512), ("qwen2.5-3b-instruct", 3_085_938_688),
    ("llama-3.1-8b-instruct", 8_030_261_248), ("llama-3.2-3b-instruct", 3_212_749_824),
    ("llama3.1-8b-prm-deepseek-data", 8_030_261_248),
])
def test_parameter_counts_match_the_published_totals(name, params):
    assert ModelProfile.load(name).total_params == params


def test_prm_shape_gqa_and_tied_embeddings():
    # Qwen2.5-Math-PRM-7B: Qwen2.5-7B's body and embedding, no LM head, score = Linear(h, h) + ReLU + Linear(h, 2)
    h = 3584
    assert QWEN_PRM.head == "score" and QWEN_PRM.architecture == "Qwen2ForProcessRewardModel"
    assert QWEN_PRM.total_params == 7_615_616_512 - 152064 * h + (h * h + h + 2 * h + 2)
    assert QWEN_PRM.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2  # GQA: 4 KV heads of 128, bf16
    qwen_3b = ModelProfile.load("qwen2.5-3b-instruct")
    assert qwen_3b.tied_embeddings and qwen_3b.weight_bytes == 2 * 3_085_938_688  # the tied head counted once
    assert qwen_3b.head_flops_per_row == 2 * 151936 * 2048  # but still multiplied per head row
    assert len(bundled_models()) == 6


PEAK, BYTE_RATE = 312e12 * 0.575, 2.039e12 * 0.934  # the A100's datasheet at the H200 probe's fractions
LAYER_KERNELS = 28 * 92.6e-6  # the 7B's 28 layers' kernels beyond the two rooflines, per iteration


def half_rows(rows: int, columns: int) -> float:
    """M_half: 0.017 waves of 108 SMs' tiles of min(max(rows, 16), 128) x 128 rows over `columns` outputs."""
    return 0.017 * 108 * min(max(rows, 16), 128) * 128 / columns


def gemm_rate(rows: int, columns: int) -> float:
    return PEAK * rows / (rows + half_rows(rows, columns))


def test_decode_iterations_of_qwen_7b_on_an_a100_match_hand_rooflines():
    """Per phase, by hand: the GEMMs read the weights or compute, whichever binds, then attention reads the KV or
    computes, then the per-layer kernels; the host adds 1.5 ms and 14.2 us per row."""
    cost = RooflineCostModel(A100)
    body, head = 2 * 6_525_621_760, 2 * 152064 * 3584  # FLOPs per token / per head row
    attention = 4 * 28 * 28 * 128  # FLOPs per (query, key)
    weights = 2 * 6_525_621_760 + 2 * 152064 * 3584  # bf16 body + LM head read once
    kv = 57_344  # bytes per token

    def expected(rows: int, context: int) -> float:
        gemms = max(rows * body / gemm_rate(rows, 3584) + rows * head / gemm_rate(rows, 152064), weights / BYTE_RATE)
        reads = max(rows * attention * context / PEAK, rows * kv * (context + 1) / BYTE_RATE)
        return 0.0015 + rows * 14.2e-6 + gemms + reads + LAYER_KERNELS

    for rows in (1, 64, 128, 256):
        work = IterationWork(decode_contexts=(1000,) * rows, head_rows=rows)
        assert cost.iteration_seconds(QWEN_7B, work, "generator") == pytest.approx(expected(rows, 1000), rel=1e-9)
    # batch 1, context 1,000: 7.49 ms of weights + 0.03 ms of KV + 2.59 ms of layer kernels + 1.5 ms fixed
    assert expected(1, 1000) == pytest.approx(0.011563, abs=2e-6)
    # batch 128 is compute-bound in its GEMMs (12.7 ms against 7.49 of weights), and its KV read adds 3.9 ms on
    # top: one roofline over the iteration would have hidden it
    assert 128 * body / gemm_rate(128, 3584) > weights / BYTE_RATE
    assert expected(128, 1000) == pytest.approx(0.020470, abs=2e-6)


def test_a_2048_token_prm_prefill_is_compute_bound_at_the_curves_rate():
    cost = RooflineCostModel(A100)
    chunks = ((128, 512),) * 16  # 16 sequences of 128 new tokens on a 512-token cached context
    work = IterationWork(prefill_chunks=chunks, head_rows=16)
    body = 2048 * 2 * 6_525_621_760 / gemm_rate(2048, 3584)
    head = 16 * 2 * (3584 * 3584 + 3584 + 2 * 3584 + 2) / gemm_rate(16, 3584)
    attention = 4 * 28 * 28 * 128 * 16 * (128 * 512 + 128 * 129 // 2) / PEAK
    weights = 2 * 6_525_621_760 + 2 * (3584 * 3584 + 3584 + 2 * 3584 + 2)
    assert body + head > weights / BYTE_RATE and attention > 57_344 * 16 * (640 + 128) / BYTE_RATE
    tokenise = 16 * 640 * 1.7e-6  # every sequence's whole input, re-tokenised
    expected = 0.003 + tokenise + body + head + attention + LAYER_KERNELS
    assert cost.iteration_seconds(QWEN_PRM, work, "prm") == pytest.approx(expected, rel=1e-9)
    assert expected == pytest.approx(0.1752, abs=5e-4)


def prm_knee(hardware: HardwareProfile) -> int:
    sim = Simulation(SimulationConfig(), cost_model=RooflineCostModel(hardware))
    threshold = sim.device.lv_threshold_tokens
    sim.close()
    return threshold


def test_the_prm_knee_follows_from_the_measured_physics_and_2048_needs_a_larger_per_call_cost():
    """The profiler's knee (90% of peak tokens/s over 256..8,192-token batches) of Qwen2.5-Math-PRM-7B on the
    A100, with the device physics the H200 probe measured: 1,024 tokens with a per-call host cost of a few ms
    (3-5 ms). The published ~2,048 needs 8-20 ms per call that the GPU's work does not hide, more than the
    probe's eager calls showed beyond 512 tokens (1.1-1.3 ms, docs/bench/gpu-cost-model.md "The GPU cost model,
    measured")."""
    for fixed_s in (0.003, 0.005):
        assert prm_knee(replace(A100, prm_iteration_fixed_s=fixed_s)) == 1024
    for fixed_s in (0.008, 0.015):
        assert prm_knee(replace(A100, prm_iteration_fixed_s=fixed_s)) == 2048


def test_a_prm_calls_additive_cost_is_a_few_ms_above_the_weight_read_floor():
    """A one-sequence PRM call costs the weights' read (the body and score head, 13.1 GB of the 14.2 GB at
    0.934 x 2.04 TB/s: 6.9 ms, the roofline's floor; the embedding is gathered, not read), the per-layer
    kernels (2.6 ms) and a few ms of host time, not 15."""
    for name in ("a100-80gb", "h100-80gb", "h200"):
        assert 0.001 <= HardwareProfile.load(name).prm_iteration_fixed_s <= 0.005
    tiny = IterationWork(prefill_chunks=((8, 0),), head_rows=1)
    floor = (QWEN_PRM.body_weight_bytes + QWEN_PRM.head_weight_bytes) / BYTE_RATE
    assert floor == pytest.approx(0.00688, abs=1e-4)
    assert RooflineCostModel(A100).iteration_seconds(QWEN_PRM, tiny, "prm") == pytest.approx(
        floor + LAYER_KERNELS + 0.003, rel=0.01)


def test_gemm_efficiency_rises_with_the_rows_of_a_call():
    """Achieved FLOP/s of the 7B body's GEMMs rises with the call's rows toward the saturated rate, faster
    for wider outputs and slower on a device with more multiprocessors to fill; the CPU profile keeps one rate.
    The probe's curve saturates early (94% at 16 rows, 99% by 1,024)."""
    rates = [A100.gemm_flop_rate(rows, 3584) for rows in (1, 4, 16, 256, 1024, 2048, 8192)]
    assert rates == sorted(rates) and rates[-1] < A100.achievable_flops
    assert rates[0] < 0.6 * A100.achievable_flops and rates[2] > 0.9 * A100.achievable_flops
    assert rates[4] > 0.99 * A100.achievable_flops
    assert A100.gemm_flop_rate(256, 18944) > A100.gemm_flop_rate(256, 3584)
    h100 = HardwareProfile.load("h100-80gb")
    assert h100.gemm_half_rows(256, 3584) > A100.gemm_half_rows(256, 3584)  # 132 SMs against 108
    cpu = HardwareProfile.load("cpu")
    assert cpu.gemm_flop_rate(16, 64) == cpu.gemm_flop_rate(4096, 64) == cpu.achievable_flops
    # PRM tokens per second rise with the tokens per call: 78% of the 8,192-token rate at 256, 94% at 1,024
    cost = RooflineCostModel(A100)
    speed = {tokens: tokens / cost.iteration_seconds(QWEN_PRM, IterationWork(
        prefill_chunks=((128, 512),) * (tokens // 128), head_rows=tokens // 128), "prm") for tokens in (256, 1024, 8192)}
    assert speed[256] < 0.8 * speed[8192] and speed[1024] > 0.9 * speed[8192]


def test_gpu_profiles_charge_host_time_per_prm_input_token_and_per_generator_row():
    """The paper's ~7% "other" time, 40% of it re-tokenising the PRM input: a PRM call costs host time per
    input token of every scored sequence (its cached prefix included), a generator iteration per row."""
    cost = RooflineCostModel(A100)
    short = IterationWork(prefill_chunks=((128, 512),) * 16, head_rows=16)
    longer = IterationWork(prefill_chunks=((128, 1512),) * 16, head_rows=16)
    extra = cost.iteration_seconds(QWEN_PRM, longer, "prm") - cost.iteration_seconds(QWEN_PRM, short, "prm")
    tokenise = 16 * 1000 * A100.prm_token_overhead_s  # 1,000 more cached tokens per sequence to re-tokenise
    assert A100.prm_token_overhead_s > 0 and extra > tokenise
    assert host_seconds(A100, longer, "prm") == pytest.approx(16 * 1640 * A100.prm_token_overhead_s)
    rows = IterationWork(decode_contexts=(500,) * 10, head_rows=10)
    assert A100.row_overhead_s > 0 and host_seconds(A100, rows, "generator") == pytest.approx(10 * A100.row_overhead_s)
    for name in ("a100-80gb", "h100-80gb", "h200"):
        profile = HardwareProfile.load(name)
        assert profile.row_overhead_s > 0 and profile.prm_token_overhead_s > 0


def test_iteration_work_reads_a_scheduled_batch():
    decode = Sequence(0, list(range(40)), None, 0)
    prefill = Sequence(1, list(range(100)), None, 1)
    batch = ScheduledBatch(decode_rows=[ScheduledRow(decode, 39, 1)], prefill_rows=[ScheduledRow(prefill, 64, 36)])
    work = IterationWork.from_batch(batch, head_rows=2, live_sequences=5)
    assert work.decode_contexts == (40,) and work.prefill_chunks == ((36, 64),) and work.live_sequences == 5
    assert work.num_tokens == 37 and work.num_rows == 2
    assert work.attended_keys == 40 + 36 * 64 + 36 * 37 // 2


def test_kv_capacity_is_what_the_weights_leave():
    capacity = kv_capacity(A100, QWEN_7B, QWEN_PRM, block_size=16, prm_share=0.3)
    free = 81920 * 2**20 * 0.9 - 4 * 2**30 - 15_231_233_024 - 14_166_949_892
    assert capacity.generator_blocks == int(free * 0.7) // (16 * 57_344)
    assert capacity.prm_blocks == int(free * 0.3) // (16 * 57_344)
    tiny = HardwareProfile(**{**A100.to_json(), "name": "tiny", "memory_bytes": 24 * 2**30})
    with pytest.raises(ValueError, match="leave no KV cache"):
        kv_capacity(tiny, QWEN_7B, QWEN_PRM, 16, 0.3)


def test_every_hardware_number_names_its_source():
    assert {"a100-80gb", "h100-80gb", "h200"} <= set(bundled_hardware())
    numbers = ("peak_flops", "memory_bandwidth", "memory_bytes", "compute_efficiency", "bandwidth_efficiency",
               "iteration_fixed_s", "prm_iteration_fixed_s", "row_overhead_s", "sequence_overhead_s",
               "memory_utilization", "reserved_bytes")
    gpu_numbers = ("multiprocessors", "gemm_half_wave", "prm_token_overhead_s", "layer_kernel_s",  # 0 on the CPU
                   "phase_rooflines")  # the CPU profile keeps one roofline
    for name in bundled_hardware():
        profile = HardwareProfile.load(name)
        missing = [n for n in numbers + (gpu_numbers if profile.multiprocessors else ()) if not profile.sources.get(n)]
        assert not missing, f"{name}: no source for {missing}"


def test_cpu_profile_fit_reproduces_the_measured_lines(tmp_path):
    """Fitted from a characterize summary and a profile-prm file, the cost model gives back the measured
    generator iteration line (fixed + per row) and the PRM line (fixed + per token)."""
    cells = {"beam": {"8": {"iteration_fixed_ms": 1.5, "iteration_per_row_ms": 0.03, "prm_call_fixed_ms": 2.5,
                            "prm_call_per_token_ms": 0.025}},
             "specscale": {"8": {"iteration_fixed_ms": 1.3, "iteration_per_row_ms": 0.031, "prm_call_fixed_ms": 2.0,
                                 "prm_call_per_token_ms": 0.026}}}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"results": cells}))
    points = [{"batch_tokens": b, "median_seconds": 0.001 + b * 29e-6, "seconds": [0.001 + b * 29e-6]}
              for b in (256, 512, 1024, 2048)]
    prm_profile = tmp_path / "prm.json"
    prm_profile.write_text(json.dumps({"points": points, "context_tokens": 512, "step_tokens": 128}))
    out = tmp_path / "cpu.json"
    profile = fit_cpu_profile(summary, prm_profile, out, decode_context_tokens=150)
    assert HardwareProfile.load(str(out)) == profile
    cost = RooflineCostModel(profile)
    generator, prm = ModelProfile.load("specscale/assets/toy-generator"), ModelProfile.load("specscale/assets/toy-prm")
    for rows in (64, 128):
        work = IterationWork(decode_contexts=(150,) * rows, head_rows=rows)
        assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(0.0014 + rows * 30.5e-6, rel=0.02)
    prefill = IterationWork(prefill_chunks=((128, 512),) * 8, head_rows=8)
    assert cost.iteration_seconds(prm, prefill, "prm") == pytest.approx(0.00225 + 1024 * 29e-6, rel=0.02)
    assert all(profile.sources.get(name) for name in ("peak_flops", "iteration_fixed_s", "row_overhead_s"))


def fit_one_cell(tmp_path, cell: dict):
    """The CPU profile fitted from a characterize summary holding one (beam, N = 8) cell."""
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"results": {"beam": {"8": cell}}}))
    return fit_cpu_profile(summary, None, None, decode_context_tokens=150)


def test_cpu_profile_fit_gives_back_the_measured_means_host_time_included(tmp_path):
    """With the cells' means, the fixed costs are what a mean iteration (PRM call) cost beyond its rows
    (tokens), the runtime's host time ("other") charged to the generator: the simulated run then spends the
    measured seconds, where the fitted lines' intercepts (per-size medians) leave out slow iterations."""
    cell = {"iteration_fixed_ms": 1.5, "iteration_per_row_ms": 0.03, "prm_call_fixed_ms": 2.5,
            "prm_call_per_token_ms": 0.025, "iterations": 400, "rows_per_iteration_mean": 100.0,
            "generation_s": 2.0, "other_s": 0.4, "verifier_calls": 100, "verification_s": 1.0,
            "prm_tokens_per_s": 25_000.0}  # 6 ms per iteration, 10 ms per call of 250 tokens
    profile = fit_one_cell(tmp_path, cell)
    cost = RooflineCostModel(profile)
    generator = ModelProfile.load("specscale/assets/toy-generator")
    work = IterationWork(decode_contexts=(150,) * 100, head_rows=100)
    assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(0.006, rel=0.02)
    assert profile.prm_iteration_fixed_s == pytest.approx(0.010 - 250 * 0.025e-3)


def characterize_cell(fixed_ms: float, row_ms: float, sequence_ms: float, rows: float, live: float) -> dict:
    """A characterize cell whose mean iteration costs fixed + row x rows + sequence x live sequences (400
    iterations; a tenth of that time is the runtime's "other" host time)."""
    per_iteration_s = (fixed_ms + row_ms * rows + sequence_ms * live) / 1000
    return {"iteration_fixed_ms": fixed_ms, "iteration_per_row_ms": 0.03, "prm_call_fixed_ms": 2.5,
            "prm_call_per_token_ms": 0.025, "iterations": 400, "rows_per_iteration_mean": rows,
            "live_sequences_mean": live, "generation_s": 0.9 * 400 * per_iteration_s,
            "other_s": 0.1 * 400 * per_iteration_s, "verifier_calls": 0, "verification_s": 0.0}


def test_cpu_profile_charges_the_host_time_per_row_not_per_iteration(tmp_path):
    """Fitted at 100 rows, the host time beyond the line's intercept goes per row: an iteration of 10 rows
    costs the intercept and 10 mean rows (1.5 + 10 x 0.045 ms), where a per-iteration fixed cost fitted
    under load charged it 3.3 ms, 2.2x the measured line's 1.8 ms (docs/simulator.md, "The CPU profile")."""
    cell = characterize_cell(1.5, 0.045, 0.0, rows=100.0, live=0.0)  # 6 ms per iteration at 100 rows
    del cell["live_sequences_mean"]  # a summary from before live sequences were recorded
    profile = fit_one_cell(tmp_path, cell)
    cost = RooflineCostModel(profile)
    generator = ModelProfile.load("specscale/assets/toy-generator")
    for rows, expected in ((100, 0.006), (10, 0.0015 + 10 * 0.045e-3)):
        work = IterationWork(decode_contexts=(150,) * rows, head_rows=rows, live_sequences=4 * rows)
        assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(expected, rel=0.01)
    assert profile.sequence_overhead_s == 0
    assert "no live sequences" in profile.sources["sequence_overhead_s"]


def test_cpu_profile_splits_the_host_time_over_rows_and_live_sequences(tmp_path):
    """Cells that recorded their live sequences: least squares over them gives back the per-row and the
    per-sequence cost they were made with, and the cost model charges both to a generator iteration."""
    shapes = {"beam": (95.0, 130.0), "naive-spec": (100.0, 330.0), "ep": (104.0, 209.0), "ep+cd": (74.0, 117.0)}
    results = {variant: {"8": characterize_cell(1.75, 0.05, 0.009, rows, live)}
               for variant, (rows, live) in shapes.items()}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"results": results}))
    profile = fit_cpu_profile(summary, None, None, decode_context_tokens=150)
    assert profile.sequence_overhead_s == pytest.approx(0.009e-3, rel=1e-6)
    cost = RooflineCostModel(profile)
    generator = ModelProfile.load("specscale/assets/toy-generator")
    work = IterationWork(decode_contexts=(150,) * 8, head_rows=8, live_sequences=40)
    assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(
        (1.75 + 8 * 0.05 + 40 * 0.009) / 1000, rel=1e-6)
    assert cost.iteration_seconds(generator, replace(work, live_sequences=0), "generator") == pytest.approx(
        (1.75 + 8 * 0.05) / 1000, rel=1e-6)
    assert "live sequences" in profile.sources["sequence_overhead_s"]


def test_simulated_iterations_carry_the_engines_live_sequences():
    """The generator's runner prices each iteration with the sequences its engine holds: at least the rows
    it runs, and more while a beam's finished siblings wait for the round (paused, not scheduled)."""

    class Recording(RooflineCostModel):
        def __init__(self, hardware):
            super().__init__(hardware)
            self.seen: list[tuple[int, int, int]] = []

        def iteration_seconds(self, model, work, role):
            if role == "generator":
                self.seen.append((work.num_rows, work.live_sequences, sim.engine.num_live_sequences))
            return super().iteration_seconds(model, work, role)

    sim = Simulation(SimulationConfig(seed=0, spare_rows=512), cost_model=Recording(A100))  # no budget query
    requests = [sim.request(p, preset_config("beam", beam_size=4, seed=i), f"q{i}")
                for i, p in enumerate(sim.problems(2))]
    sim.runtime(max_concurrency=2).run(requests)
    seen = sim.cost_model.seen
    assert seen and all(live == engine_live >= rows for rows, live, engine_live in seen)
    assert any(live > rows for rows, live, _ in seen)
    sim.close()


def test_cpu_profile_does_not_charge_a_few_row_iteration_the_weights_twice(tmp_path):
    """Decode compute-bound under load (a slow PRM token sets the FLOP rate), memory-bound at a few rows: the
    roofline reads the weights in every few-row iteration, so their read time comes off the fixed part and
    the cost model gives back the measured line at 4 rows as at the loaded 100; kept in the fixed part, a
    4-row iteration cost the weights' 0.41 ms twice (+24%)."""
    cell = {**characterize_cell(1.5, 0.045, 0.0, rows=100.0, live=0.0), "prm_call_per_token_ms": 0.05}
    profile = fit_one_cell(tmp_path, cell)
    cost = RooflineCostModel(profile)
    generator = ModelProfile.load("specscale/assets/toy-generator")
    loaded = IterationWork(decode_contexts=(150,) * 100, head_rows=100)
    assert max(flops(generator, loaded) / cost.hardware.achievable_flops,
               bytes_moved(generator, loaded) / cost.hardware.achievable_bandwidth) * 1000 > 100 * 0.025  # compute
    for rows in (4, 100):
        work = IterationWork(decode_contexts=(150,) * rows, head_rows=rows)
        expected = (1.5 + rows * 0.045) / 1000
        assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(expected, rel=0.03)


def low_load_summaries(tmp_path, fixed_ms=0.6, row_ms=0.05, sequence_ms=0.004):
    """A loaded characterize run and one at one request in flight, both made with fixed + row x rows +
    sequence x live per mean iteration, the loaded lines' intercepts at 1.5 ms (what loaded runs measure:
    about twice a few-row iteration's fixed cost, docs/bench/simulator-validation.md, "A real low-load point")."""
    shapes = {"beam": (92.0, 148.0), "naive-spec": (98.0, 389.0), "ep": (100.0, 224.0), "ep+cd": (74.0, 115.0)}
    loaded = {variant: {"8": {**characterize_cell(fixed_ms, row_ms, sequence_ms, rows, live), "iteration_fixed_ms": 1.5}}
              for variant, (rows, live) in shapes.items()}
    prm_means = {"verifier_calls": 100, "verification_s": 0.6, "prm_tokens_per_s": 200 / 0.006,
                 "prm_call_per_token_ms": 0.02}  # 6 ms per call of 200 tokens: 2 ms beyond its tokens
    low = {variant: {"8": {**characterize_cell(fixed_ms, row_ms, sequence_ms, rows, live), "iteration_fixed_ms": 0.5,
                           **prm_means}}
           for variant, (rows, live) in {"beam": (4.75, 7.7), "specscale": (5.8, 7.7)}.items()}
    paths = tmp_path / "loaded.json", tmp_path / "low.json"
    for path, results in zip(paths, (loaded, low), strict=True):
        path.write_text(json.dumps({"results": results}))
    return paths


def test_cpu_profile_takes_the_fixed_costs_from_a_low_load_run(tmp_path):
    """With a one-in-flight characterize run, the fixed part is what its few-row mean iterations cost beyond
    the loaded run's per-row and per-sequence terms: the cost model gives back the mean iteration at 5 rows
    and at 92, where the loaded lines' 1.5 ms intercept made the few-row iteration ~2x too slow."""
    loaded, low = low_load_summaries(tmp_path)
    generator = ModelProfile.load("specscale/assets/toy-generator")
    profile = fit_cpu_profile(loaded, None, None, decode_context_tokens=150, low_load=(low,))
    cost = RooflineCostModel(profile)
    for rows, live in ((5, 8), (92, 148)):
        work = IterationWork(decode_contexts=(150,) * rows, head_rows=rows, live_sequences=live)
        expected = (0.6 + rows * 0.05 + live * 0.004) / 1000
        assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(expected, rel=0.03)
    assert profile.sequence_overhead_s == pytest.approx(0.004e-3, rel=1e-3)
    assert profile.prm_iteration_fixed_s == pytest.approx(0.002, rel=1e-6)  # the low-load calls', not 2.5 ms
    assert "low-load" in profile.sources["iteration_fixed_s"] and "low-load" in profile.sources["prm_iteration_fixed_s"]
    few_rows = IterationWork(decode_contexts=(150,) * 5, head_rows=5, live_sequences=8)
    loaded_only = RooflineCostModel(fit_cpu_profile(loaded, None, None, decode_context_tokens=150))
    assert loaded_only.iteration_seconds(generator, few_rows, "generator") > 1.5 * cost.iteration_seconds(
        generator, few_rows, "generator")


def test_cpu_fit_command_line_takes_a_low_load_summary(tmp_path):
    """`python -m specscale_lab.calibration.cpu_fit --characterize LOADED --low-load ONE_IN_FLIGHT --out FILE` writes the
    profile fitted from both and names both inputs."""
    from specscale_lab.calibration.cpu_fit import main

    loaded, low = low_load_summaries(tmp_path)
    out = tmp_path / "cpu.json"
    assert main(["--characterize", str(loaded), "--low-load", str(low), "--out", str(out)]) == 0
    profile = HardwareProfile.load(str(out))
    assert profile == fit_cpu_profile(loaded, None, None, low_load=(low,))
    assert str(low) in profile.description
    pooled = fit_cpu_profile(loaded, None, None, low_load=(low, low))  # two runs: their cells pooled
    assert pooled.iteration_fixed_s == pytest.approx(profile.iteration_fixed_s, rel=1e-9)


def test_a_low_load_fixed_cost_below_the_weights_read_raises_the_bandwidth(tmp_path):
    """A few-row iteration that costs less beyond its rows than reading the toy generator's weights at 16 GB/s
    (0.41 ms) shows they streamed faster (they stay in the caches): the fit takes the bandwidth from it, and
    the cost model gives back 0.3 ms + the rows at 5 rows, where clamping the fixed part at 0 kept 0.41 ms."""
    loaded, low = low_load_summaries(tmp_path, fixed_ms=0.3)
    profile = fit_cpu_profile(loaded, None, None, decode_context_tokens=150, low_load=(low,))
    generator = ModelProfile.load("specscale/assets/toy-generator")
    weight_bytes = generator.body_weight_bytes + generator.head_weight_bytes
    assert weight_bytes / 16e9 > 0.0004
    assert profile.memory_bandwidth == pytest.approx(weight_bytes / 0.0003, rel=0.02)
    assert profile.iteration_fixed_s == 0 and "fitted" in profile.sources["memory_bandwidth"]
    cost = RooflineCostModel(profile)
    for rows, live in ((5, 8), (92, 148)):
        work = IterationWork(decode_contexts=(150,) * rows, head_rows=rows, live_sequences=live)
        expected = (0.3 + rows * 0.05 + live * 0.004) / 1000
        assert cost.iteration_seconds(generator, work, "generator") == pytest.approx(expected, rel=0.03)
