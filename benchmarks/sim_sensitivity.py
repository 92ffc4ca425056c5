"""Sensitivity of the simulated ladder to every cost and workload parameter (docs/simulator.md, "Parameters").

    python benchmarks/sim_sensitivity.py split                  # the paper's time split, beam N = 4 (calibration)
    python benchmarks/sim_sensitivity.py ladder --out DIR       # specscale / beam at N = 8 per perturbed parameter
    python benchmarks/sim_sensitivity.py work --out FILE.md     # where each variant's time goes; what batching could win

`split` serves 100 MATH-500 problems with non-speculative beam search at N = 4 (Qwen2.5-7B-Instruct +
Qwen2.5-Math-PRM-7B on the A100 profile, 32 in flight) on a cost model that books every iteration's
seconds by role and part (GPU, fixed, host), and prints generation / verification, the host shares and
the host costs per PRM input token and per generator row that would make the host time the paper's
~7% "other" (40% of it re-tokenising the PRM input): what the A100 profile's `prm_token_overhead_s` and
`row_overhead_s` are calibrated to.

`ladder` runs `specscale simulate throughput --variants beam,specscale --beam-sizes 8 --problems 100` once
with the bundled profile and preset and once per perturbation below (a hardware or workload JSON with one
number changed, passed with `--hardware` / `--workload`), and prints `specscale / beam` and its change for
each: the sensitivity column. Simulations run on the virtual clock: no CPU lock, run it with `nice`.

`work` serves the same problems with each variant (A100, the 7B generator unless `--generator` names
another, 32 in flight) and books every iteration's seconds by part: the per-iteration costs (fixed, host,
per-layer kernels) and the device's GEMM and attention time, with the work done (generator iterations and
rows, PRM engine iterations and computed tokens). A PRM iteration's fixed and per-layer-kernel seconds are
what batching the PRM can remove, so it also gives each variant's `/ beam` ratio as it would be with
knee-sized PRM calls (the lazy-verification ideal: every computed token in calls of the knee's size) and
with no per-call PRM cost at all, against the measured `beam`: the most any batching of the same
verification work could win.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from specscale.costmodel.cost import RooflineCostModel, fixed_seconds, host_seconds, prm_input_tokens
from specscale.costmodel.hardware import HardwareProfile
from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import preset

HARDWARE, GENERATOR, PRM, DATASET = "a100-80gb", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b", "math500"
PAPER_OTHER_SHARE, PAPER_TOKENISE_SHARE = 0.07, 0.4  # of runtime; of "other"

# (label, "hardware" | "workload" | "prm", field, new value as a function of the old one)
PERTURBATIONS = (
    ("compute_efficiency x 1.2", "hardware", "compute_efficiency", lambda v: v * 1.2),
    ("bandwidth_efficiency x 0.9", "hardware", "bandwidth_efficiency", lambda v: v * 0.9),
    ("gemm_half_wave x 2", "hardware", "gemm_half_wave", lambda v: v * 2),
    ("gemm_half_wave = 0 (constant efficiency)", "hardware", "gemm_half_wave", lambda v: 0.0),
    ("layer_kernel_s x 0.5 (a fusing engine)", "hardware", "layer_kernel_s", lambda v: v * 0.5),
    ("layer_kernel_s = 0", "hardware", "layer_kernel_s", lambda v: 0.0),
    ("phase_rooflines false (one roofline)", "hardware", "phase_rooflines", lambda v: False),
    ("iteration_fixed_s x 2", "hardware", "iteration_fixed_s", lambda v: v * 2),
    ("prm_iteration_fixed_s x 2", "hardware", "prm_iteration_fixed_s", lambda v: v * 2),
    ("prm_iteration_fixed_s = 15 ms (before)", "hardware", "prm_iteration_fixed_s", lambda v: 0.015),
    ("prm_token_overhead_s x 2", "hardware", "prm_token_overhead_s", lambda v: v * 2),
    ("row_overhead_s x 2", "hardware", "row_overhead_s", lambda v: v * 2),
    ("sequence_overhead_s = 3.25 us (the CPU fit's)", "hardware", "sequence_overhead_s", lambda v: 3.25e-6),
    ("reserved_bytes x 2", "hardware", "reserved_bytes", lambda v: v * 2),
    ("perfect_share_sound 0.1", "prm", "perfect_share_sound", lambda v: 0.1),
    ("perfect_share_sound 0.6", "prm", "perfect_share_sound", lambda v: 0.6),
    ("perfect_share_erred x 2", "prm", "perfect_share_erred", lambda v: v * 2),
    ("auc 0.85 -> 0.75", "prm", "auc", lambda v: 0.75),
    ("detection 0.7 -> 0.5", "prm", "detection", lambda v: 0.5),
    ("logit_spread x 1.5", "prm", "logit_spread", lambda v: v * 1.5),
    ("sound_logit_mean - 1", "prm", "sound_logit_mean", lambda v: v - 1),
    ("accuracy - 0.1", "workload", "accuracy", lambda v: v - 0.1),
    ("steps_median x 1.5", "workload", "steps_median", lambda v: v * 1.5),
    # a within-request spread: the toy trace's is a third of its spread over every solution (0.16 against 0.48)
    ("steps_sigma / 3", "workload", "steps_sigma", lambda v: v / 3),
    ("step_tokens_median x 1.5", "workload", "step_tokens_median", lambda v: v * 1.5),
    ("step_tokens_sigma x 1.5", "workload", "step_tokens_sigma", lambda v: v * 1.5),
    ("top_token_prob 0.9867 -> 0.95", "workload", "top_token_prob", lambda v: 0.95),
    ("question_tokens_median x 2", "workload", "question_tokens_median", lambda v: v * 2),
)


class BookedCostModel(RooflineCostModel):
    """The roofline, booking each iteration's seconds by role: total, fixed, host and per-layer kernels; the
    iterations, their computed tokens and rows, and (PRM) the input tokens its calls score, cached ones included."""

    def __init__(self, hardware: HardwareProfile):
        super().__init__(hardware)
        self.book = empty_book()

    def iteration_seconds(self, model, work, role):
        seconds = super().iteration_seconds(model, work, role)
        book = self.book[role]
        book["seconds"] += seconds
        book["fixed"] += fixed_seconds(self.hardware, role)
        book["host"] += host_seconds(self.hardware, work, role)
        book["kernels"] += model.num_layers * self.hardware.layer_kernel_s
        book["iterations"] += 1
        book["tokens"] += work.num_tokens
        book["rows"] += work.num_rows
        if role == "prm":
            book["input_tokens"] += prm_input_tokens(work)
        return seconds


def empty_book() -> dict[str, dict[str, float]]:
    parts = ("seconds", "fixed", "host", "kernels", "iterations", "tokens", "rows")
    return {"generator": dict.fromkeys(parts, 0), "prm": dict.fromkeys((*parts, "input_tokens"), 0)}


def split(problems: int, beam_size: int) -> dict:
    run = booked_run("beam", problems, beam_size)
    generator, prm, total = run["generator"], run["prm"], run["elapsed_s"]
    base = total - generator["host"] - prm["host"]  # the run without the calibrated host terms
    scale = 1 / (1 - PAPER_OTHER_SHARE)  # host share h of the run with them: H = h / (1 - h) x base
    return {
        "simulated_s": total, "generation_s": generator["seconds"], "verification_s": prm["seconds"],
        "generation_over_verification": generator["seconds"] / prm["seconds"],
        "generator_fixed_s": generator["fixed"], "generator_host_s": generator["host"],
        "prm_fixed_s": prm["fixed"], "prm_host_s": prm["host"], "prm_calls_input_tokens": prm["input_tokens"],
        "generator_rows": generator["rows"],
        "host_share": (generator["host"] + prm["host"]) / total,
        "tokenise_share": prm["host"] / total,
        "prm_token_overhead_s_for_paper": PAPER_OTHER_SHARE * PAPER_TOKENISE_SHARE * scale * base / prm["input_tokens"],
        "row_overhead_s_for_paper": PAPER_OTHER_SHARE * (1 - PAPER_TOKENISE_SHARE) * scale * base / generator["rows"],
    }


# ---- where each variant's time goes --------------------------------------------------------------------
def booked_run(variant: str, problems: int, beam_size: int, generator: str = GENERATOR) -> dict:
    """One variant's run on a booked cost model: its seconds and work by role and part, its output tokens,
    and the PRM's knee and per-call cost (fixed plus per-layer kernels) on this device."""
    hardware = HardwareProfile.load(HARDWARE)
    cost = BookedCostModel(hardware)
    sim = Simulation(SimulationConfig(hardware=HARDWARE, generator=generator, prm=PRM, dataset=DATASET), cost)
    requests = [sim.request(p, preset_config(variant, beam_size=beam_size, seed=i), f"q{i}")
                for i, p in enumerate(sim.problems(problems))]
    runtime = sim.runtime(max_concurrency=32)  # prices the LV threshold's profile batches on the cost model,
    cost.book = empty_book()  # which the clock never ran
    start = sim.clock()
    results = runtime.run(requests)
    elapsed = sim.clock() - start
    sim.close()
    per_call = fixed_seconds(hardware, "prm") + sim.prm_profile.num_layers * hardware.layer_kernel_s
    return {"variant": variant, "generator_model": generator, "elapsed_s": elapsed,
            "output_tokens": sum(r.usage.output_tokens for r in results), "knee_tokens": sim.device.lv_threshold_tokens, "prm_per_call_s": per_call, **cost.book}


def bounded(run: dict, beam_tok_s: float) -> dict:
    """The run's `/ beam` ratio measured, and with its PRM per-call seconds replaced by those of knee-sized
    calls over the same computed tokens, or removed (the same work, batched as well as it could be)."""
    prm = run["prm"]
    per_call_paid = prm["fixed"] + prm["kernels"]
    knee_calls = -(-prm["tokens"] // run["knee_tokens"])  # ceil: every computed token in calls of the knee's size

    def ratio(seconds: float) -> float:
        return run["output_tokens"] / seconds / beam_tok_s

    return {"measured": ratio(run["elapsed_s"]),
            "knee_calls": ratio(run["elapsed_s"] - per_call_paid + knee_calls * run["prm_per_call_s"]),
            "no_per_call": ratio(run["elapsed_s"] - per_call_paid)}


def work(problems: int, beam_size: int, variants: list[str], workers: int, generator: str = GENERATOR) -> list[dict]:
    if variants[0] != "beam":
        raise ValueError("the first variant must be beam (the ratios' base)")
    count = len(variants)
    with ProcessPoolExecutor(workers) as pool:
        runs = list(pool.map(booked_run, variants, [problems] * count, [beam_size] * count, [generator] * count))
    beam_tok_s = runs[0]["output_tokens"] / runs[0]["elapsed_s"]
    return [{**run, "ratios": bounded(run, beam_tok_s)} for run in runs]


def work_markdown(runs: list[dict], problems: int, beam_size: int) -> str:
    header = ("| variant | s | × beam | × beam, knee-sized PRM calls | × beam, no per-call PRM cost "
              "| generator iterations | rows / iteration | generator s: per-iteration / the rest "
              "| PRM iterations | PRM tokens computed | PRM s: per-call / the rest |")
    lines = [f"{problems} problems, N = {beam_size}, {runs[0]['generator_model']} + {PRM} on {HARDWARE}, 32 in flight; "
             f"the PRM's knee {runs[0]['knee_tokens']:,} tokens, {1e3 * runs[0]['prm_per_call_s']:.2f} ms per call "
             "(fixed and per-layer kernels; per iteration of the PRM engine: a call of several waves pays it for each).",
             "", header, "|" + " --- |" * header.count(" | ") + " --- |"]
    for run in runs:
        gen, prm, r = run["generator"], run["prm"], run["ratios"]
        gen_fixed = gen["fixed"] + gen["kernels"]  # per iteration; the rest: the device's GEMM, attention, host per row
        prm_per_call = prm["fixed"] + prm["kernels"]
        lines.append(f"| {run['variant']} | {run['elapsed_s']:.1f} | {r['measured']:.3f} | {r['knee_calls']:.3f} "
                     f"| {r['no_per_call']:.3f} | {gen['iterations']:,} | {gen['rows'] / max(gen['iterations'], 1):.1f} "
                     f"| {gen_fixed:.1f} / {gen['seconds'] - gen_fixed:.1f} | {prm['iterations']:,} "
                     f"| {prm['tokens']:,} | {prm_per_call:.1f} / {prm['seconds'] - prm_per_call:.1f} |")
    return "\n".join(lines) + "\n"


# ---- the ladder per perturbation --------------------------------------------------------------------
def perturbed_files(folder: Path, kind: str, name: str, change) -> list[str]:
    """The options that run the simulation with one parameter changed (hardware or workload JSON)."""
    if kind == "hardware":
        data = HardwareProfile.load(HARDWARE).to_json()
        data[name] = change(data[name])
        path = folder / "hardware.json"
        path.write_text(json.dumps(data))
        return ["--hardware", str(path)]
    workload = preset(DATASET, GENERATOR, PRM)
    if kind == "prm":
        workload = replace(workload, prm=replace(workload.prm, **{name: change(getattr(workload.prm, name))}))
    else:
        workload = replace(workload, **{name: change(getattr(workload, name))})
    path = folder / "workload.json"
    path.write_text(json.dumps(workload.to_json()))
    return ["--workload", str(path)]


def ladder_ratio(folder: Path, options: list[str], problems: int, workers: int) -> tuple[float, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "specscale.cli", "simulate", "throughput", "--variants", "beam,specscale",
               "--beam-sizes", "8", "--problems", str(problems), "--workers", str(workers),
               "--out", str(folder / "run"), *options]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((folder / "run" / "summary.json").read_text())["results"]
    cells = {variant: results[variant]["8"] for variant in ("beam", "specscale")}
    return cells["specscale"]["output_tokens_per_s"] / cells["beam"]["output_tokens_per_s"], cells


def ladder(out: Path, problems: int, workers: int, only: list[str] | None) -> list[dict]:
    rows = []
    base, cells = ladder_ratio(out / "base", [], problems, workers)
    rows.append({"parameter": "bundled values", "ratio": base, "change": 0.0,
                 "beam_tok_s": cells["beam"]["output_tokens_per_s"]})
    print(f"| bundled values | {base:.3f} | | {cells['beam']['output_tokens_per_s']:,.0f} |", flush=True)
    for index, (label, kind, name, change) in enumerate(PERTURBATIONS):
        if only and name not in only:
            continue
        folder = out / f"p{index:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        ratio, cells = ladder_ratio(folder, perturbed_files(folder, kind, name, change), problems, workers)
        rows.append({"parameter": label, "ratio": ratio, "change": ratio - base,
                     "beam_tok_s": cells["beam"]["output_tokens_per_s"]})
        print(f"| {label} | {ratio:.3f} | {ratio - base:+.3f} | {cells['beam']['output_tokens_per_s']:,.0f} |",
              flush=True)
    (out / "sensitivity.json").write_text(json.dumps(rows, indent=2))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("split", help="the time split of non-speculative beam search (calibration)")
    one.add_argument("--problems", type=int, default=100)
    one.add_argument("--beam-size", type=int, default=4)
    many = sub.add_parser("ladder", help="specscale / beam at N = 8 per perturbed parameter")
    many.add_argument("--out", type=Path, required=True)
    many.add_argument("--problems", type=int, default=100)
    many.add_argument("--workers", type=int, default=2)
    many.add_argument("--only", type=lambda text: text.split(","), default=None, help="fields to perturb")
    booked = sub.add_parser("work", help="where each variant's time goes; what batching the PRM could win")
    booked.add_argument("--out", type=Path, required=True, help="markdown table; its .json beside it")
    booked.add_argument("--problems", type=int, default=100)
    booked.add_argument("--beam-size", type=int, default=8)
    booked.add_argument("--variants", type=lambda text: text.split(","),
                        default="beam,beam+cd,beam+cd+lv,ep,ep+cd,specscale-nospec,specscale".split(","))
    booked.add_argument("--workers", type=int, default=2)
    booked.add_argument("--generator", default=GENERATOR, help="a bundled generator shape")
    args = parser.parse_args(argv)
    if args.command == "split":
        print(json.dumps(split(args.problems, args.beam_size), indent=2))
        return 0
    if args.command == "work":
        runs = work(args.problems, args.beam_size, args.variants, args.workers, args.generator)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(work_markdown(runs, args.problems, args.beam_size))
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=2))
        print(args.out.read_text())
        return 0
    print("| parameter perturbed | specscale / beam, N = 8 | change | beam output tok/s |\n| --- | --- | --- | --- |")
    ladder(args.out, args.problems, args.workers, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
