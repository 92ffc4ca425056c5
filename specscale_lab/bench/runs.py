"""A sub-command's runs: the testbed the options name (`open_testbed`: checkpoints, `--backend real` on our engine
or `--backend vllm` on vLLM's, or the simulator, `--backend sim`, each through `specscale/composition.py`
`build_stack`), a fresh runtime per run
(`fresh_runtime`: the PRM's step-prefix cache and the engines' free prefixes emptied, so no run inherits
another's work), one batch of requests served at once and timed on the stack's clock (`run_batch`), the
requests with paired seeds (`search_requests`, `paired_seed`: the same sampling seed for a problem in every
variant) and the interleaved order of repeats (`interleaved`: every variant in each repeat, rotated, so a slow
spell on a shared machine hits all variants alike)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import torch
from tqdm import tqdm

from specscale.composition import build_stack
from specscale.costmodel.model_profile import ModelProfile
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.search.presets import preset_config
from specscale.search.result import SearchResult
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.stack import Stack
from specscale.usage_error import UsageError
from specscale.verify.prm import Verifier
from specscale.vllm_backend.engine_args import VllmBackendError
from specscale.vllm_backend.selection import stack_description
from specscale.vllm_backend.stack import VllmPipelineConfig, VllmStack
from specscale_lab.bench.arguments import apply_mode_defaults, given_search_flags
from specscale_lab.bench.outputs import run_info
from specscale_lab.bench.testbed import PROBLEM_SET_SEED, RealTestbed, SimulatedTestbed, Testbed
from specscale_lab.calibration.workload_choice import choose_workload, default_dataset
from specscale_lab.tasks.toy import ToyProblem, toy_problems

Cell = TypeVar("Cell")  # what `interleaved` runs: a (variant, beam size, ...) tuple of the sub-command's
SEED_STRIDE = 1_000_003  # paired_seed: seed s of problem i is s * SEED_STRIDE + i
VLLM_SELECTION = ("generator_backend", "verifier_backend", "vllm_arg")  # what only real models read


def open_testbed(args) -> Testbed:
    """The testbed `--backend` names: checkpoints (`open_pipeline`: our engine or vLLM's) or the simulator
    (`open_simulation`)."""
    if getattr(args, "backend", "real") == "sim":
        refuse_vllm_selection(args)
        return SimulatedTestbed(open_simulation(args))
    return RealTestbed(open_pipeline(args))


def refuse_vllm_selection(args) -> None:
    given = [name for name in VLLM_SELECTION if getattr(args, name, None)]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise UsageError(f"{flags}: the real models' backends; --backend sim runs the simulator")


def open_pipeline(args, **fields) -> Pipeline | VllmStack:
    """The stack on checkpoints the options describe (our engine, or vLLM's: `real_stack_description`), built
    once per sub-command (torch's CPU threads as --threads says); `fields` sets further `PipelineConfig` fields
    (system prompt)."""
    description = real_stack_description(args, pipeline_config(args, **fields))
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return build_stack(description)
    except VllmBackendError as error:  # a model vLLM cannot run, memory it cannot take: one line
        raise UsageError(str(error)) from None


def highest_level(max_concurrency: int | list[int]) -> int:
    """The stack's default requests in flight: --max-concurrency, or its highest level in a load sweep (each run
    sets its own level: `fresh_runtime`)."""
    return max(max_concurrency) if isinstance(max_concurrency, list) else max_concurrency


def real_stack_description(args, config: PipelineConfig) -> PipelineConfig | VllmPipelineConfig:
    """`solve`'s backend selection (`vllm_backend/selection.py`) over bench's `--backend real|vllm` (or eval's
    `engine|vllm`): vLLM missing, a bad --vllm-arg are one line (exit 2) before anything loads."""
    backend = getattr(args, "backend", "real")
    selection = argparse.Namespace(**{**vars(args), "backend": "engine" if backend == "real" else backend})
    try:
        return stack_description(selection, config)
    except VllmBackendError as error:
        raise UsageError(str(error)) from None


def open_simulation(args) -> Simulation:
    """The simulated stack the options describe; one torch thread unless --threads (tiny tensors)."""
    torch.set_num_threads(args.threads or 1)
    return build_stack(simulation_config(args))


def pipeline_config(args, **fields) -> PipelineConfig:
    """The models, their serving and the device-property overrides (--spare-rows, --lv-threshold) as a
    `PipelineConfig`; a missing model folder is a one-line exit."""
    for folder in (args.generator, args.prm):
        if not (Path(folder) / "config.json").is_file():
            raise SystemExit(f"no model at {folder}: train the bundled toy models "
                             "(python -m specscale_lab.train toy) or pass --generator/--prm")
    fields.setdefault("device", getattr(args, "device", "cpu"))
    return PipelineConfig(
        generator=args.generator, prm=args.prm, generator_dtype=args.dtype, prm_dtype=args.dtype,
        generator_kv_gb=args.kv_gb, prm_kv_gb=args.prm_kv_gb, max_concurrency=highest_level(args.max_concurrency),
        lv_threshold_tokens=args.lv_threshold, spare_rows=args.spare_rows, kernels=args.kernels,
        profile_prm=getattr(args, "profile_prm", True), **fields,
    )


def simulation_config(args) -> SimulationConfig:
    """The simulated device, models and workload the options name, as a `SimulationConfig`."""
    generator, prm = ModelProfile.load(args.generator).name, ModelProfile.load(args.prm).name
    dataset = args.dataset or default_dataset(args.generator)
    workload = choose_workload(dataset, generator, prm, args.workload, getattr(args, "perfect_share", None))
    return SimulationConfig(
        hardware=args.hardware, generator=args.generator, prm=args.prm, dataset=dataset, workload=workload,
        prm_kv_share=args.prm_kv_share, spare_rows=args.spare_rows,
        lv_threshold_tokens=args.lv_threshold, seed=args.seed,
    )


def fresh_runtime(stack: Testbed | Stack, max_concurrency: int, **options) -> SearchRuntime:
    """A runtime with empty metrics over the stack's backends; options: `runtime`'s (instrumented
    stand-ins for the backends, callbacks)."""
    if isinstance(stack.verifier, Verifier):  # no run may reuse PRM prefixes another variant computed
        stack.verifier.clear()
    stack.forget_cached_prefixes()  # nor blocks another run left in an engine's prefix cache (ours or vLLM's)
    return stack.runtime(max_concurrency, **options)


@dataclass
class BatchRun:
    """One batch of requests served to completion: results in request order, time on the runtime's
    clock, the runtime."""

    results: list[SearchResult]
    elapsed_s: float
    runtime: SearchRuntime
    load_before: float  # 1-minute load average when the run started


def run_batch(runtime: SearchRuntime, requests: list[SearchRequest], progress=None) -> BatchRun:
    """Issue every request at once and step the runtime until all are answered; elapsed_s is read on the
    runtime's clock (wall seconds on a `Pipeline`, simulated seconds on a `Simulation`)."""
    load = os.getloadavg()[0]
    start = runtime.clock()
    results = runtime.run(requests, progress=None if progress is None else progress.update)
    return BatchRun(results, runtime.clock() - start, runtime, load)


def start_run(name: str, args, full: dict, quick: dict, warm_variants: Iterable[str] | None = None):
    """Resolve the mode's defaults, open the testbed, record the run and warm every variant up.
    Returns ``(testbed, info, started)``; ``finish_info(info, started)`` closes the record."""
    apply_mode_defaults(args, full, quick)
    started = time.perf_counter()
    testbed = open_testbed(args)
    info = run_info(name, args, testbed)
    if testbed.warms_up:
        warm_up(testbed, args.variants if warm_variants is None else warm_variants, given_search_flags(args))
    return testbed, info, started


def warm_up(testbed: Testbed, variants: Iterable[str], flags: dict) -> None:
    """One short search per variant before anything is timed (kernel build, allocator, caches): two rounds
    of one retained path (beam size = the beam width the flags or the preset give)."""
    problem = testbed.problems(1)[0]
    width = {"beam_width": flags["beam_width"]} if "beam_width" in flags else {}
    configs = {variant: preset_config(variant, max_rounds=2, seed=0, **width) for variant in variants}
    requests = [testbed.request(problem, replace(config, beam_size=config.beam_width), f"warm-up {variant}")
                for variant, config in configs.items()]
    run_batch(fresh_runtime(testbed, len(requests)), requests)


def toy_workload(count: int) -> list[ToyProblem]:
    """The first `count` problems of the fixed held-out set (the same for every sub-command)."""
    return toy_problems("test", count, seed=PROBLEM_SET_SEED)


def paired_seed(seed: int, problem_index: int) -> int:
    """The sampling seed of one problem under sampling seed `seed`: the same in every variant."""
    return seed * SEED_STRIDE + problem_index


def search_requests(testbed: Testbed | Simulation, problems: list, variant: str, seed: int,
                    tag: str = "", **config) -> list[SearchRequest]:
    """One request per problem with the variant's preset and paired seeds; config overrides the preset."""
    return [testbed.request(p, preset_config(variant, seed=paired_seed(seed, i), **config), f"{tag}{variant} {i}")
            for i, p in enumerate(problems)]


def interleaved(cells: list[Cell], repeats: int) -> Iterator[tuple[int, Cell]]:
    """(repeat, cell) in run order: every cell once per repeat, the order rotated by one cell per
    repeat, so no variant always runs first or right after the same neighbour."""
    for repeat in range(repeats):
        shift = repeat % len(cells)
        for cell in cells[shift:] + cells[:shift]:
            yield repeat, cell


def progress_bar(total: int, description: str) -> tqdm:
    # disable=None: drawn on a terminal only, so a log or a pipe does not collect thousands of redraws
    return tqdm(total=total, desc=description, unit="req", dynamic_ncols=True, file=sys.stderr, disable=None)
