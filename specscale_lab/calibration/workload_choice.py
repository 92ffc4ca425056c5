"""Which workload a simulated run uses: a bundled preset, the toy models' own, or one read from a file.

`choose_workload(dataset, generator, prm, source, perfect_share)`:
- `source` a trace (`.jsonl`, written by `specscale trace`, docs/simulator.md "Traces"): the preset of
  (dataset, generator, prm) with everything the trace measures fitted from it (`trace.fit_workload`);
- `source` a workload JSON (`WorkloadParams.to_json`): exactly that;
- no source: `workload.preset(dataset, generator, prm)`, or `workload.TOY` for the data set "toy" (the
  bundled toy models on the toy task, docs/toy-models.md).
A generator or PRM without a preset (a model folder of one's own) takes the nearest bundled defaults
(`FALLBACK_GENERATOR`, `FALLBACK_PRM`) as the base a trace is fitted onto; without a trace that is a guess,
and the returned workload's `sources` say so. `perfect_share` (`--perfect-share`) sets the share of exact
1.0 scores among sound steps (`with_perfect_share`), the erred steps' share scaled with it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specscale.sim.workload import DATASETS, GENERATOR_ACCURACY, PRM_PRESETS, TOY, WorkloadParams, preset
from specscale_lab.calibration.trace import fit_workload, read_trace

TOY_DATASET = "toy"
DATASET_CHOICES = (*DATASETS, TOY_DATASET)
FALLBACK_GENERATOR = "qwen2.5-7b-instruct"
FALLBACK_PRM = "qwen2.5-math-prm-7b"


def choose_workload(dataset: str, generator: str, prm: str, source: str | None = None,
                    perfect_share: float | None = None) -> WorkloadParams:
    workload = chosen_workload(dataset, generator, prm, source)
    return workload if perfect_share is None else with_perfect_share(workload, perfect_share)


def with_perfect_share(workload: WorkloadParams, share: float) -> WorkloadParams:
    """The workload with `share` exact 1.0 scores among sound steps; the erred steps' share keeps its ratio
    to it (0.03 / 0.30 for Qwen2.5-Math-PRM-7B), so the PRM's shortcut stays as informative."""
    prm = workload.prm
    ratio = prm.perfect_share_erred / prm.perfect_share_sound if prm.perfect_share_sound else 0.1
    scores = replace(prm, perfect_share_sound=share, perfect_share_erred=share * ratio)
    note = f"--perfect-share {share:g} (erred steps {share * ratio:.3g})"
    return replace(workload, prm=scores, sources={**workload.sources, "perfect_share": note})


def chosen_workload(dataset: str, generator: str, prm: str, source: str | None) -> WorkloadParams:
    base = base_workload(dataset, generator, prm)
    if source is None:
        return base
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"no workload file {source!r} (a trace .jsonl or a workload .json)")
    if path.suffix == ".jsonl":
        _, requests = read_trace(path)
        return fit_workload(requests, base)
    return WorkloadParams.from_json(json.loads(path.read_text()))


def base_workload(dataset: str, generator: str, prm: str) -> WorkloadParams:
    """The preset for these names; unknown models fall back to the bundled defaults, noted in `sources`."""
    if dataset == TOY_DATASET:
        return TOY
    known_generator = generator if generator in GENERATOR_ACCURACY else FALLBACK_GENERATOR
    known_prm = prm if prm in PRM_PRESETS else FALLBACK_PRM
    workload = preset(dataset, known_generator, known_prm)
    guesses = [f"{mine} has no preset: {stand_in}'s numbers stand in (fit them from a trace: --workload)"
               for mine, stand_in in ((generator, known_generator), (prm, known_prm)) if mine != stand_in]
    if not guesses:
        return workload
    return replace(workload, sources={**workload.sources, "models": "; ".join(guesses)})


def default_dataset(generator: str) -> str:
    """The toy task for the bundled toy generator, else MATH-500."""
    return TOY_DATASET if Path(generator).name == "toy-generator" else "math500"
