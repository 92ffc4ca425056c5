"""The simulator's roofline against a GPU probe (benchmarks/gpu_cost_probe.py): each measured decode iteration
and PRM call beside what a hardware profile predicts for it, and the device-side parameters fitted from the
probe alone (never from a throughput ladder).

Compared is the probe's CUDA-graph time (the GPU's work, no host time) with the profile's device seconds
(specscale/costmodel/cost.py `device_seconds`: its iteration seconds less the host terms, since the fixed and
per-row costs are host-side: scheduling, sampling, launches); the eager times are reported beside it.

Fitted jointly, least squares of the relative error over the first shape's decode iterations and PRM calls:
compute_efficiency, bandwidth_efficiency, gemm_half_wave and layer_kernel_s (a grid, refined twice). The
second shape's iterations are held out: they test the fit. Reported beside them, from the GEMM sweep alone:
the body GEMMs' saturated efficiency (2,048+ rows) and the weight-streaming efficiency of one-row GEMMs.

    python benchmarks/gpu_cost_fit.py docs/bench/gpu/h200-probe/probe.json --hardware h200 \
        --compare docs/bench/gpu/h200-probe/h200-datasheet.json      # the profile before the probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from specscale.costmodel.cost import IterationWork, device_seconds
from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile

BODY_LINEARS = ("qkv", "o", "gate_up", "down")
PRM_SHAPE = "qwen2.5-math-prm-7b"  # the probe's PRM calls run Qwen2.5-7B's body with this model's score head


def decode_work(point: dict) -> IterationWork:
    return IterationWork(decode_contexts=(point["context"],) * point["rows"], head_rows=point["rows"],
                         live_sequences=point["rows"])


def prefill_work(point: dict) -> IterationWork:
    return IterationWork(prefill_chunks=((point["new"], point["cached"]),) * point["sequences"],
                         head_rows=point["sequences"])


def fit_compute_efficiency(gemms: list[dict], peak: float) -> float:
    rates = [2 * g["rows"] * g["in"] * g["out"] / g["seconds"] for g in gemms
             if g["linear"] in BODY_LINEARS and g["rows"] >= 2048]
    return statistics.median(rates) / peak


def fit_bandwidth_efficiency(gemms: list[dict], layers: int, peak_bandwidth: float) -> float:
    one_row = [g for g in gemms if g["rows"] == 1]
    weights = sum(2 * g["in"] * g["out"] * (layers if g["linear"] in BODY_LINEARS else 1) for g in one_row)
    seconds = sum(g["seconds"] * (layers if g["linear"] in BODY_LINEARS else 1) for g in one_row)
    return weights / seconds / peak_bandwidth


GRID = {"compute_efficiency": (0.40, 0.80), "bandwidth_efficiency": (0.60, 1.00), "gemm_half_wave": (0.0, 0.40),
        "layer_kernel_s": (0.0, 150e-6)}


class ProbedIteration(NamedTuple):
    """One decode iteration or PRM call of the probe: what it computed and its measured seconds."""

    label: str
    work: IterationWork
    model: ModelProfile
    seconds: float  # CUDA-graph replay: the GPU's work only
    eager_s: float | None  # launched from Python, where the probe timed it


def points(probe: dict, shape: str) -> list[ProbedIteration]:
    """Every decode iteration and PRM call probed on `shape`."""
    measured = probe["models"][shape]
    generator, prm = ModelProfile.load(shape), ModelProfile.load(PRM_SHAPE)
    decodes = [ProbedIteration(f"decode {d['rows']} x {d['context']}", decode_work(d), generator, d["graph_s"],
                               d.get("eager_s")) for d in measured["decode"]]
    calls = [ProbedIteration(f"PRM {p['sequences']} x {p['new']} over {p['cached']}", prefill_work(p), prm,
                             p["graph_s"], p["eager_s"]) for p in measured.get("prefill", [])]
    return decodes + calls


def relative_error(hardware: HardwareProfile, point: ProbedIteration) -> float:
    return device_seconds(hardware, point.model, point.work) / point.seconds - 1


def squared_error(hardware: HardwareProfile, probed: list[ProbedIteration]) -> float:
    return sum(relative_error(hardware, point) ** 2 for point in probed)


def fit(hardware: HardwareProfile, probed: list[ProbedIteration], steps: int = 9, rounds: int = 3) -> HardwareProfile:
    """The GRID's four parameters of least squared relative error: a grid of `steps` per parameter, then
    `rounds - 1` finer grids around the best point."""
    spans = dict(GRID)
    best = hardware
    for _ in range(rounds):
        axes = {name: [low + (high - low) * i / (steps - 1) for i in range(steps)] for name, (low, high) in spans.items()}
        candidates = [replace(hardware, compute_efficiency=c, bandwidth_efficiency=b, gemm_half_wave=w, layer_kernel_s=k)
                      for c in axes["compute_efficiency"] for b in axes["bandwidth_efficiency"]
                      for w in axes["gemm_half_wave"] for k in axes["layer_kernel_s"]]
        best = min(candidates, key=lambda candidate: squared_error(candidate, probed))
        spans = {name: (max(GRID[name][0], getattr(best, name) - (high - low) / (steps - 1)),
                        min(GRID[name][1], getattr(best, name) + (high - low) / (steps - 1)))
                 for name, (low, high) in spans.items()}
    return replace(best, compute_efficiency=round(best.compute_efficiency, 3),
                   bandwidth_efficiency=round(best.bandwidth_efficiency, 3),
                   gemm_half_wave=round(best.gemm_half_wave, 3), layer_kernel_s=round(best.layer_kernel_s, 7))


def table(probe: dict, profiles: dict[str, HardwareProfile], shape: str) -> list[str]:
    lines = [f"| {shape} | measured graph ms | eager ms | " + " | ".join(f"{n} ms (× measured)" for n in profiles)
             + " |", "| --- | ---: | ---: |" + " ---: |" * len(profiles)]
    for point in points(probe, shape):
        cells = [f"{device_seconds(hw, point.model, point.work) * 1e3:.2f} ({relative_error(hw, point) + 1:.2f})"
                 for hw in profiles.values()]
        eager = "" if point.eager_s is None else f"{point.eager_s * 1e3:.2f}"
        lines.append(f"| {point.label} | {point.seconds * 1e3:.2f} | {eager} | " + " | ".join(cells) + " |")
    return lines


def worst(hardware: HardwareProfile, probed: list[ProbedIteration]) -> float:
    return max(abs(relative_error(hardware, point)) for point in probed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("probe", type=Path)
    parser.add_argument("--hardware", default="h200")
    parser.add_argument("--compare", nargs="*", default=[], help="more profiles (JSON paths) to put beside them")
    args = parser.parse_args()
    probe = json.loads(args.probe.read_text())
    bundled = HardwareProfile.load(args.hardware)
    shapes = list(probe["models"])
    gemms = probe["models"][shapes[0]]["gemm"]
    layers = probe["models"][shapes[0]]["shape"]["layers"]
    fitted = fit(bundled, points(probe, shapes[0]))
    print(f"device {probe['facts'].get('name')}, torch {probe['facts']['torch']}; ceilings: "
          f"{probe['ceilings']['matmul_flops'] / 1e12:.0f} TFLOP/s bf16 8192^3, "
          f"copy {probe['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s (read + write)")
    print(f"GEMMs alone ({shapes[0]}): saturated efficiency "
          f"{fit_compute_efficiency(gemms, bundled.peak_flops):.3f}, one-row weight streaming "
          f"{fit_bandwidth_efficiency(gemms, layers, bundled.memory_bandwidth):.3f} of the datasheet")
    for field in (*GRID, "iteration_fixed_s", "prm_iteration_fixed_s"):
        print(f"{field}: {args.hardware} profile {getattr(bundled, field)}, fitted {getattr(fitted, field)}")
    for shape in shapes:
        probed = points(probe, shape)
        print(f"\nworst |predicted / measured - 1| on {shape}: profile {worst(bundled, probed):.2f}, "
              f"fitted {worst(fitted, probed):.2f}{'' if shape == shapes[0] else ' (held out)'}")
        others = {Path(path).stem: HardwareProfile.load(path) for path in args.compare}
        for name, other in others.items():
            print(f"worst on {shape}, {name}: {worst(other, probed):.2f}")
        print("\n".join(table(probe, {**others, args.hardware: bundled, "fitted": fitted}, shape)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
