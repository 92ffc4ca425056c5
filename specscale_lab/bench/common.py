"""Plumbing every `specscale bench` sub-command shares.

- arguments: `add_common_arguments` (workload, models, `--out`, `--quick`) and `apply_mode_defaults`,
  which fills the options a user left unset from the sub-command's full or quick defaults;
- the serving stack (`bench/stack.py`): `open_stack` builds the generator engine and the PRM verifier
  once, on checkpoints (`--backend real`, `open_pipeline`) or on the simulator (`--backend sim`, the
  options of `add_simulation_arguments`; docs/simulator.md); `fresh_runtime` gives a `SearchRuntime`
  with fresh metrics over it (the PRM's step-prefix cache emptied, so no run inherits another's work),
  and `run_batch` issues a list of requests at once through it (`SearchRuntime.run`) and times it on
  the stack's clock (wall or simulated seconds);
- the workload: the stack's problems (`toy_workload` on real models: held-out toy problems, a fixed
  problem set) and `paired_seed` (the same sampling seed for a problem in every variant, so variants
  differ only by their policies);
- repeats: `interleaved` orders the runs of one repeat with every variant in it, rotated from
  repeat to repeat, so a slow spell on a shared machine hits all variants alike; `median_summary`
  reduces per-repeat numbers to their medians;
- outputs: `run_info` (command, git commit, machine, load) and `write_outputs`, which writes
  `raw.json`, `summary.json` (results keyed by variant, then beam size), `<name>.md` and `<name>.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import torch
from tqdm import tqdm

from specscale.config import KERNEL_MODES
from specscale.costmodel.hardware import bundled_hardware
from specscale.costmodel.model_profile import bundled_models
from specscale.model.machine import MachineFingerprint
from specscale.pipeline import Pipeline, PipelineConfig
from specscale.runtime.runtime import SearchRequest, SearchRuntime
from specscale.search.presets import preset_config, split_variants
from specscale.search.result import SearchResult
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.verify.prm import Verifier
from specscale_lab.bench.stack import PROBLEM_SET_SEED, BenchStack, RealStack, SimulatedStack
from specscale_lab.calibration.workload_choice import DATASET_CHOICES, choose_workload, default_dataset
from specscale_lab.tasks.toy import ToyProblem, is_correct, toy_problems

LADDER = ("beam", "beam+cd", "beam+cd+lv", "specscale-nospec", "naive-spec", "fasttts", "fasttts-xb", "ep-strict",
          "ep", "ep+cd", "specscale")
Cell = TypeVar("Cell")  # what `interleaved` runs: a (variant, beam size, ...) tuple of the sub-command's
SEED_STRIDE = 1_000_003  # paired_seed: seed s of problem i is s * SEED_STRIDE + i
DEFAULT_CONCURRENCY = 32  # the evaluation's load: at most 32 requests in flight
QUIET_CPU = 0.15  # share of all CPUs busy with other processes above which timings are flagged untrustworthy
SIMULATED_REPEATS = 1  # a simulation is deterministic under its seed: a repeat would replay the same run
IGNORED_BY_BACKEND = {  # options a backend does not read (left out of the recorded command line)
    "real": frozenset({"backend", "hardware", "dataset", "workload", "prm_kv_share", "perfect_share"}),
    "sim": frozenset({"kv_gb", "prm_kv_gb", "device", "dtype"}),
}


# ---- arguments ------------------------------------------------------------------------------------
def add_common_arguments(parser, variants: bool = True, problems: bool = True) -> None:
    """Options every sub-command takes (--variants and --problems where it has them). Those left at
    None are filled by `apply_mode_defaults`."""
    parser.add_argument("--out", required=True, help="folder for raw.json, summary.json, <name>.md, <name>.png")
    parser.add_argument("--quick", action="store_true", help="a small workload that finishes in under 2 minutes")
    add_model_arguments(parser)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (docs/gpu.md)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats; the median is reported")
    parser.add_argument("--beam-sizes", type=int_list, default=None, help="comma-separated beam sizes N")
    parser.add_argument("--beam-width", type=int, default=4, help="children per retained path M")
    parser.add_argument("--max-rounds", type=int, default=None, help="rounds per search (SearchConfig's default: 40)")
    parser.add_argument("--max-concurrency", type=int, default=None,
                        help=f"requests in flight at most (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--seed", type=int, default=0, help="first sampling seed")
    parser.add_argument("--filter-duplicates", action="store_true",
                        help="identical paths compete as one in selection (search-and-learn's option; off in the "
                             "paper's ladder)")
    if problems:
        parser.add_argument("--problems", type=int, default=None, help="toy test problems per run")
    if variants:
        parser.add_argument("--variants", "--presets", dest="variants", type=split_variants, default=None,
                            help="comma-separated presets, each optionally with SearchConfig fields changed: "
                                 "preset[field=value,...] (e.g. specscale[lv_sibling_trigger=false])")
    add_simulation_arguments(parser)


def add_simulation_arguments(parser) -> None:
    """`--backend sim` (what `specscale simulate` sets): the simulated device and workload
    (docs/simulator.md). --generator / --prm then name bundled model shapes or folders with a config.json."""
    group = parser.add_argument_group("simulation (--backend sim, or `specscale simulate`)")
    group.add_argument("--backend", choices=("real", "sim"), default="real",
                       help="real: the checkpoints on this machine; sim: the simulator on a virtual clock")
    group.add_argument("--hardware", default="cpu",
                       help=f"bundled hardware profile ({', '.join(bundled_hardware())}) or a profile JSON path")
    group.add_argument("--dataset", choices=DATASET_CHOICES, default=None,
                       help="workload preset (default: toy for the toy generator, else math500)")
    group.add_argument("--workload", default=None,
                       help="a trace (.jsonl, `specscale trace`) fitted onto the preset, or a workload JSON")
    group.add_argument("--prm-kv-share", type=float, default=SimulationConfig.prm_kv_share,
                       help="share of the KV memory left after the weights that goes to the PRM")
    group.add_argument("--perfect-share", type=float, default=None,
                       help="share of sound steps the simulated PRM scores exactly 1.0 (default: the preset's)")


def add_model_arguments(parser) -> None:
    """The models and how they are served: what `open_pipeline` reads."""
    parser.add_argument("--generator", default=PipelineConfig.generator,
                        help=f"generator folder (default: toy); simulated: also a bundled shape ({', '.join(bundled_models())})")
    parser.add_argument("--prm", default=PipelineConfig.prm,
                        help="PRM folder (default: the bundled toy PRM); simulated: also a bundled shape")
    parser.add_argument("--dtype", default="auto", help="model dtype for both models (default: the engine's)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / transposed / torch")
    parser.add_argument("--kv-gb", type=float, default=PipelineConfig.generator_kv_gb, help="generator KV pool")
    parser.add_argument("--prm-kv-gb", type=float, default=PipelineConfig.prm_kv_gb, help="PRM KV pool")
    parser.add_argument("--spare-rows", type=int, default=None,
                        help="speculative rows only fill an iteration up to this many rows (default: the device's budget on its "
                             "cost model, costmodel/row_budget.py; no cap on a device without one)")
    parser.add_argument("--lv-threshold", type=int, default=None,
                        help="lazy-verification threshold in PRM tokens (default: the PRM's profile on this device, "
                             "measured at the first start; else the cost model's knee, else 2048)")
    parser.add_argument("--profile-prm", action=argparse.BooleanOptionalAction, default=True,
                        help="profile a PRM never profiled on this device at start (default); --no-profile-prm: "
                             "take the cost model's knee instead")


def int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def float_list(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def str_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def apply_mode_defaults(args, full: dict, quick: dict) -> None:
    """Options left at None take the sub-command's quick or full default."""
    defaults = {"max_concurrency": DEFAULT_CONCURRENCY, **(quick if args.quick else full)}
    if getattr(args, "backend", "real") == "sim":
        defaults["repeats"] = SIMULATED_REPEATS
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


# ---- the serving stack ----------------------------------------------------------------------------
def open_pipeline(args, **config) -> Pipeline:
    """The generator engine and the PRM verifier, built once per sub-command; `config` sets further
    `PipelineConfig` fields (device, system prompt)."""
    for folder in (args.generator, args.prm):
        if not (Path(folder) / "config.json").is_file():
            raise SystemExit(f"no model at {folder}: train the bundled toy models "
                             "(python -m specscale_lab.train toy) or pass --generator/--prm")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config.setdefault("device", getattr(args, "device", "cpu"))
    return Pipeline(PipelineConfig(
        generator=args.generator, prm=args.prm, generator_dtype=args.dtype, prm_dtype=args.dtype,
        generator_kv_gb=args.kv_gb, prm_kv_gb=args.prm_kv_gb, max_concurrency=args.max_concurrency,
        lv_threshold_tokens=args.lv_threshold, spare_rows=args.spare_rows, kernels=args.kernels,
        profile_prm=getattr(args, "profile_prm", True), **config,
    ))


def open_stack(args) -> BenchStack:
    """The stack `--backend` names: checkpoints (`open_pipeline`) or the simulator (`open_simulation`)."""
    if getattr(args, "backend", "real") == "sim":
        return SimulatedStack(open_simulation(args))
    return RealStack(open_pipeline(args))


def open_simulation(args) -> Simulation:
    """The simulated device, models and workload the options name; one torch thread (tiny tensors)."""
    torch.set_num_threads(args.threads or 1)
    from specscale.costmodel.model_profile import ModelProfile

    generator, prm = ModelProfile.load(args.generator).name, ModelProfile.load(args.prm).name
    dataset = args.dataset or default_dataset(args.generator)
    workload = choose_workload(dataset, generator, prm, args.workload, getattr(args, "perfect_share", None))
    return Simulation(SimulationConfig(
        hardware=args.hardware, generator=args.generator, prm=args.prm, dataset=dataset, workload=workload,
        prm_kv_share=args.prm_kv_share, spare_rows=args.spare_rows,
        lv_threshold_tokens=args.lv_threshold, seed=args.seed,
    ))


def fresh_runtime(stack: BenchStack | Pipeline | Simulation, max_concurrency: int, **options) -> SearchRuntime:
    """A runtime with empty metrics over the stack's backends; options: `runtime`'s (instrumented
    stand-ins for the backends, callbacks)."""
    if isinstance(stack.verifier, Verifier):  # no run may reuse PRM prefixes another variant computed
        stack.verifier.clear()
    for engine in stack.local_engines():  # nor blocks another run left in an engine's prefix cache: each run
        engine.forget_free_prefixes()   # computes its questions' KV, as the first one did
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
    """Resolve the mode's defaults, open the pipeline, record the run and warm every variant up.
    Returns ``(pipeline, info, started)``; ``finish_info(info, started)`` closes the record."""
    apply_mode_defaults(args, full, quick)
    started = time.perf_counter()
    stack = open_stack(args)
    info = run_info(name, args, stack)
    if stack.warms_up:
        warm_up(stack, args.variants if warm_variants is None else warm_variants, args.beam_width)
    return stack, info, started


def warm_up(stack: BenchStack, variants: Iterable[str], beam_width: int) -> None:
    """One short search per variant before anything is timed (kernel build, allocator, caches)."""
    problem = stack.problems(1)[0]
    requests = [stack.request(problem, preset_config(
        variant, beam_size=beam_width, beam_width=beam_width, max_rounds=2, seed=0), f"warm-up {variant}")
        for variant in dict.fromkeys(variants)]
    run_batch(fresh_runtime(stack, len(requests)), requests)


# ---- the workload ---------------------------------------------------------------------------------
def toy_workload(count: int) -> list[ToyProblem]:
    """The first `count` problems of the fixed held-out set (the same for every sub-command)."""
    return toy_problems("test", count, seed=PROBLEM_SET_SEED)


def paired_seed(seed: int, problem_index: int) -> int:
    """The sampling seed of one problem under sampling seed `seed`: the same in every variant."""
    return seed * SEED_STRIDE + problem_index


def search_settings(args, beam_size: int) -> dict:
    """The search settings every sub-command takes from its arguments, as preset overrides."""
    return {"beam_size": beam_size, "beam_width": args.beam_width, "max_rounds": args.max_rounds,
            "filter_duplicates": args.filter_duplicates}


def search_requests(stack: BenchStack, problems: list, variant: str, seed: int,
                    tag: str = "", **config) -> list[SearchRequest]:
    """One request per problem with the variant's preset and paired seeds; config overrides the preset."""
    return [stack.request(p, preset_config(variant, seed=paired_seed(seed, i), **config), f"{tag}{variant} {i}")
            for i, p in enumerate(problems)]


def is_right(problem: ToyProblem, result: SearchResult) -> bool:
    """The search's chosen path boxes the true answer (a toy or a simulated problem: both carry `answer`)."""
    return result.best is not None and is_correct(problem, result.best.text)


def vote_is_right(problem: ToyProblem, answer: str | None) -> bool:
    """A voted answer (already extracted from its box) equals the true answer."""
    return answer is not None and answer.strip("$ ") == problem.answer


def serving_numbers(run: BatchRun, problems: list[ToyProblem]) -> dict[str, float]:
    """Throughput numbers of one batch (docs/BENCHMARKS.md): output tokens are the tokens of the returned paths
    (every one of the N), answer tokens those of the selected path only; flush_reasons counts why each
    lazy-verification batch ran."""
    elapsed = run.elapsed_s
    metrics = run.runtime.metrics.summary()
    usage = [r.usage for r in run.results]
    correct = sum(is_right(p, r) for p, r in zip(problems, run.results, strict=True))
    generation, verification = metrics["generation_s"], metrics["verification_s"]
    generated = sum(u.generated_tokens for u in usage)
    return {
        "elapsed_s": elapsed,
        "output_tokens_per_s": sum(u.output_tokens for u in usage) / elapsed,
        "answer_tokens_per_s": sum(r.best.num_tokens for r in run.results if r.best is not None) / elapsed,
        "requests_per_s": len(run.results) / elapsed,
        "correct_per_s": correct / elapsed,
        "generated_tokens_per_s": sum(u.generated_tokens for u in usage) / elapsed,
        "accuracy": correct / len(run.results),
        "output_tokens": sum(u.output_tokens for u in usage),
        "generated_tokens": sum(u.generated_tokens for u in usage),
        "wasted_tokens": sum(u.wasted_tokens for u in usage),
        "wasted_share": sum(u.wasted_tokens for u in usage) / generated if generated else 0.0,
        "generation_s": generation,
        "verification_s": verification,
        "other_s": other_seconds(elapsed, generation, verification),
        **prm_numbers(run.runtime),
        "physical_to_logical": metrics["physical_to_logical"],
        "peak_kv_blocks": metrics["peak_kv_blocks"],
        "load_before": run.load_before,
    }


def prm_numbers(runtime: SearchRuntime) -> dict:
    """How a run's PRM calls were batched: how many, their median items and tokens, the requests each held
    on average, and why lazy batches were flushed."""
    metrics = runtime.metrics.summary()
    keys = ("verifier_calls", "verifier_batch_items_median", "verifier_batch_tokens_median",
            "verifier_batch_requests_mean")
    return {**{k: metrics[k] for k in keys}, "flush_reasons": runtime.flush_reasons}


# ---- repeats --------------------------------------------------------------------------------------
def interleaved(cells: list[Cell], repeats: int) -> Iterator[tuple[int, Cell]]:
    """(repeat, cell) in run order: every cell once per repeat, the order rotated by one cell per
    repeat, so no variant always runs first or right after the same neighbour."""
    for repeat in range(repeats):
        shift = repeat % len(cells)
        for cell in cells[shift:] + cells[:shift]:
            yield repeat, cell


def median_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over repeats (metrics every run has); flush reasons, counted per repeat, too."""
    keys = [k for k in runs[0] if all(isinstance(r.get(k), (int, float)) for r in runs)]
    summary = {k: statistics.median(r[k] for r in runs) for k in keys}
    if all(isinstance(r.get("flush_reasons"), dict) for r in runs):
        reasons = sorted({k for r in runs for k in r["flush_reasons"]})
        summary["flush_reasons"] = {k: statistics.median(r["flush_reasons"].get(k, 0) for r in runs) for k in reasons}
    return summary


def flush_text(reasons: dict | None) -> str:
    """A cell's flush reasons for a table: "sibling-group 916, deferrals 71" (none: "–")."""
    if not reasons:
        return "–"
    return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def progress_bar(total: int, description: str) -> tqdm:
    # disable=None: drawn on a terminal only, so a log or a pipe does not collect thousands of redraws
    return tqdm(total=total, desc=description, unit="req", dynamic_ncols=True, file=sys.stderr, disable=None)


# ---- outputs --------------------------------------------------------------------------------------
def run_info(name: str, args, stack: BenchStack | None = None, command: str | None = None) -> dict:
    """What reproduces and qualifies a result: command, code version, machine, load, settings (the
    stack's: models, or the simulated hardware and workload). command: how the run was asked for
    (`specscale bench`, or `specscale simulate` when that is the command parsed)."""
    command = command or f"specscale {getattr(args, 'command', None) or 'bench'}"
    info = {
        "benchmark": name,
        "command": command_line(name, args, command),
        "argv": sys.argv,
        "git_commit": git_commit(),
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "load_average_start": os.getloadavg(),
        "other_cpu_busy_start": other_cpu_busy(),
        "quick": args.quick,
    }
    if stack is not None:
        info.update(stack.describe())
    return info


SWITCHES_ON_BY_DEFAULT = frozenset({"profile_prm"})  # --X / --no-X options (argparse.BooleanOptionalAction)


def command_line(name: str, args, command: str = "specscale bench") -> str:
    """`<command> <name>` (`specscale bench <name>` by default) with every option spelled out, as parsed,
    but those the run's backend does not read."""
    parts = [*command.split(), name]
    unread = IGNORED_BY_BACKEND[getattr(args, "backend", "real")]
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command", "bench_command") or key in unread or value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if value is False:  # a switch that is on by default is recorded when off; store_true ones are left out
            parts += [f"--no-{flag[2:]}"] if key in SWITCHES_ON_BY_DEFAULT else []
        elif value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            parts += [flag, ",".join(map(str, value))]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)


def git_commit() -> str | None:
    """HEAD of the checkout this package runs from, '+dirty' when tracked files changed; None if none."""
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict:
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "isa": MachineFingerprint.current().describe(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": "cpu",
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def finish_info(info: dict, started: float) -> dict:
    """Add the run's duration and the load at its end (our own process counts in it)."""
    return dict(info, duration_s=time.perf_counter() - started, load_average_end=os.getloadavg(),
                busy_machine=info["other_cpu_busy_start"] > QUIET_CPU)


def other_cpu_busy(seconds: float = 1.0) -> float:
    """Share of all CPUs busy over ``seconds`` while this process sleeps, i.e. busy with other work
    (unlike the load average, this does not count the sub-command that ran just before). 0 when
    ``/proc/stat`` is missing."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields) - idle, sum(fields)
    if not Path("/proc/stat").is_file():
        return 0.0
    busy0, total0 = sample()
    time.sleep(seconds)
    busy1, total1 = sample()
    return (busy1 - busy0) / max(1, total1 - total0)


def write_outputs(out: str | Path, name: str, info: dict, raw, results: dict, markdown: str, figure,
                  extra: dict | None = None) -> Path:
    """raw.json (every run), summary.json (results[variant][beam size] + extras), <name>.md, <name>.png."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "raw.json").write_text(json.dumps({"run": info, "runs": raw}, indent=2, default=str) + "\n")
    summary = {"run": info, "results": results, **(extra or {})}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (folder / f"{name}.md").write_text(header_markdown(name, info) + markdown + f"\n![{name}]({name}.png)\n")
    figure.savefig(folder / f"{name}.png", dpi=110)
    return folder


def header_markdown(name: str, info: dict) -> str:
    machine = info["machine"]
    load = info["other_cpu_busy_start"]
    simulated = info.get("backend") == "sim"  # simulated times do not depend on the machine's load
    busy = " — **busy machine: timings are not trustworthy**" if info.get("busy_machine") and not simulated else ""
    title = info["command"].split(" --")[0].split(" ")[:2]
    return (f"# {' '.join(title)} {name}\n\n```bash\n{info['command']}\n```\n\n"
            f"commit `{info['git_commit']}`, {machine['cpu']} ({machine['cpu_count']} CPUs, "
            f"{machine['torch_threads']} torch threads), {load:.0%} of the CPUs busy with other work at start{busy}, "
            f"{info.get('duration_s', 0.0):.0f} s{' (quick mode)' if info['quick'] else ''}.\n\n"
            + kernels_markdown(info) + simulated_markdown(info))


def kernels_markdown(info: dict) -> str:
    """For a run on checkpoints: the machine's ISA and the kernel paths each model took."""
    kernels = info.get("kernels") or {}
    if not kernels:
        return ""
    paths = "; ".join(f"{role}: linears {report.get('linear_paths')}, attention {report.get('attention')}, "
                      f"prefill attention {report.get('prefill_attention')}" for role, report in kernels.items())
    return f"Machine: {info['machine'].get('isa', '')}. Kernels ({paths}).\n\n"


def simulated_markdown(info: dict) -> str:
    """For a simulated run: the device and workload simulated; every time in the report is simulated."""
    if info.get("backend") != "sim":
        return ""
    hardware, workload, models = info["hardware"], info["workload"], info["models"]
    return (f"**Simulated** (docs/simulator.md): {models['generator']} + {models['prm']} on {hardware['name']}, "
            f"workload `{workload['name']}`, {info['kv_blocks']:,} generator / {info['prm_kv_blocks']:,} PRM KV "
            f"blocks, LV threshold {info['lv_threshold_tokens']:,} tokens. Times and rates are simulated "
            f"seconds.\n\n")


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table; numbers right-aligned and formatted by `cell`."""
    align = ["---" if i == 0 else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def other_seconds(elapsed: float, generation: float, verification: float) -> float:
    """Wall (or simulated) time spent neither generating nor verifying. On the virtual clock the elapsed
    time is exactly the sum of the two, so what is left is float rounding (~1e-14 s): reported as 0."""
    other = elapsed - generation - verification
    return other if other > 1e-9 * max(elapsed, 1.0) else 0.0


def cell(value) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if magnitude >= 0.1 or value == 0 else f"{value:.3g}"


def new_figure(rows: int, cols: int, width: float = 6.0, height: float = 4.0):
    """A matplotlib figure on the Agg backend (no display), with its axes as a flat list."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width * cols, height * rows), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False)
    return figure, [ax for row in axes for ax in row]
