"""`specscale trace`: record a search run as a trace (docs/simulator.md, "Traces").

Serves `--problems` problems with one preset through the same testbed and runtime as `specscale bench`
(`bench/testbed.py`) and writes every request's candidates (steps, token counts, PRM scores, answers) as a
versioned JSONL trace (`specscale_lab/calibration/trace.py`). On real models (`--backend real`, the default) the problems are the
toy task's (`--dataset toy`, the default) or a bundled data set's (`--dataset math500|gsm8k|olympiadbench`, with the math system
prompt and answer equivalence as `specscale eval` grades it): a trace recorded with real models on one's own
GPU is what `specscale simulate --workload trace.jsonl` fits its workload to. On the simulator
(`--backend sim`) it records the simulated run, e.g. to check a fit against the workload that made it.
Record fitting traces with `best-of-n` (the default): its samples are unselected.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from specscale.former_flag import add_former_name
from specscale.grading import load_problems, shared_grader
from specscale.preset_argument import preset_argument
from specscale.prompts import MATH_SYSTEM_PROMPT
from specscale.search.presets import preset_config
from specscale_lab.bench.arguments import (
    DEFAULT_CONCURRENCY,
    add_model_arguments,
    add_simulation_arguments,
    given_search_flags,
)
from specscale_lab.bench.runs import fresh_runtime, open_pipeline, open_testbed, paired_seed, progress_bar, run_batch
from specscale_lab.bench.testbed import RealTestbed, Testbed
from specscale_lab.calibration.trace import TraceHeader, TraceRequest, trace_request, write_trace
from specscale_lab.cli_checks import check_search_settings

TOY_TASK = "toy"


def add_trace(sub) -> None:
    p = sub.add_parser("trace", help="record a search run's steps, token counts and PRM scores as a trace "
                       "the simulator can fit its workload to (docs/simulator.md)")
    p.add_argument("--out", required=True, help="trace file (JSONL)")
    p.add_argument("--preset", default="best-of-n", type=preset_argument,
                   help="a preset or preset[field=value,...] (best-of-n: unselected samples)")
    p.add_argument("--problems", type=int, default=32)
    p.add_argument("--beam-size", type=int, default=None, help="N (default: the preset's)")
    p.add_argument("--beam-width", type=int, default=None, help="M (default: the preset's)")
    p.add_argument("--max-rounds", type=int, default=None, help="rounds per search (default: the preset's)")
    p.add_argument("--max-concurrency", type=int, default=DEFAULT_CONCURRENCY)
    p.add_argument("--seed", type=int, default=0, help="first sampling seed (problem i: paired_seed(seed, i))")
    p.add_argument("--device", default="cpu", help="cpu or cuda (docs/gpu.md)")
    p.add_argument("--no-token-ids", action="store_true", help="leave out token ids (share no text-level detail)")
    p.add_argument("--notes", default="", help="free text for the trace's header")
    add_model_arguments(p)
    dataset = add_simulation_arguments(p, dataset_help="the problems: real models, the toy task (default) or a bundled "
                                                       "data set; simulated, the workload preset (default: toy for "
                                                       "the toy generator, else math500)")
    add_former_name(p, "--task", dataset)
    p.set_defaults(func=run_trace, quick=False)


def run_trace(args) -> int:
    check_search_settings(args.preset, given_search_flags(args))
    started = time.perf_counter()
    testbed, problems, grade = open_trace_testbed(args)
    requests = record(testbed, args, problems, grade)
    header = trace_header(args, testbed)
    testbed.close()
    write_trace(args.out, header, requests)
    completed = sum(s.completed for r in requests for s in r.steps)
    print(f"{len(requests)} requests, {completed} completed paths -> {args.out} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


def open_trace_testbed(args) -> tuple[Testbed, list, object]:
    """The testbed, the problems (each with `question` and a gold answer) and the grade(answer, gold) to use."""
    if args.backend == "sim" or real_dataset(args) == TOY_TASK:
        testbed = open_testbed(args)
        return testbed, testbed.problems(args.problems), None  # exact match: toy and simulated answers are plain
    testbed = RealTestbed(open_pipeline(args, system_prompt=MATH_SYSTEM_PROMPT))
    grader = shared_grader()
    return testbed, load_problems(real_dataset(args), args.problems), grader.equivalent


def traced_dataset(args, described: dict) -> str:
    """The problems a testbed served: a simulation's workload preset, else the real models' data set."""
    return described["simulation"]["dataset"] if described["backend"] == "sim" else real_dataset(args)


def real_dataset(args) -> str:
    """The problems real models solve: --dataset, else the toy task."""
    return args.dataset or TOY_TASK


def record(testbed: Testbed, args, problems: list, grade) -> list[TraceRequest]:
    requests = [testbed.request(p, preset_config(args.preset, seed=paired_seed(args.seed, i), **given_search_flags(args)),
                              f"q{i}") for i, p in enumerate(problems)]
    runtime = fresh_runtime(testbed, args.max_concurrency)
    with progress_bar(len(requests), f"trace {args.preset}") as bar:
        run_batch(runtime, requests, bar)
    tokenizer = testbed.stack.tokenizer
    return [trace_request(r.request_id, runtime.search(r.request_id), p.question, len(r.prompt_ids), tokenizer,
                          gold_of(p), grade, keep_token_ids=not args.no_token_ids)
            for r, p in zip(requests, problems, strict=True)]


def gold_of(problem) -> str:
    """A data set's `gold`, a toy or simulated problem's `answer`."""
    return getattr(problem, "gold", None) or problem.answer


def trace_header(args, testbed: Testbed) -> TraceHeader:
    described = testbed.describe()
    models = described["models"]
    config = preset_config(args.preset, **given_search_flags(args))
    return TraceHeader(generator=models["generator"], prm=models["prm"], temperature=config.temperature,
                       search=asdict(config) | {"max_concurrency": args.max_concurrency, "seed": args.seed},
                       source="simulated" if described["backend"] == "sim" else "real",
                       notes=args.notes or f"specscale trace --dataset {traced_dataset(args, described)} "
                                                f"--preset {args.preset}")
