"""`specscale trace`: record a search run as a trace (docs/simulator.md, "Traces").

Serves `--problems` problems with one preset through the same stack and runtime as `specscale bench`
(`bench/stack.py`) and writes every request's candidates (steps, token counts, PRM scores, answers) as a
versioned JSONL trace (`specscale_lab/calibration/trace.py`). On real models (`--backend real`, the default) the problems are the
toy task's (`--task toy`) or a bundled data set's (`--task math500|gsm8k|olympiadbench`, with the math system
prompt and answer equivalence as `specscale eval` grades it): a trace recorded with real models on one's own
GPU is what `specscale simulate --workload trace.jsonl` fits its workload to. On the simulator
(`--backend sim`) it records the simulated run, e.g. to check a fit against the workload that made it.
Record fitting traces with `best-of-n` (the default): its samples are unselected.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from specscale.grading import DATASETS, load_problems, shared_grader
from specscale.prompts import MATH_SYSTEM_PROMPT
from specscale.search.presets import preset_config
from specscale_lab.bench.common import (
    DEFAULT_CONCURRENCY,
    add_model_arguments,
    add_simulation_arguments,
    fresh_runtime,
    open_pipeline,
    open_stack,
    paired_seed,
    progress_bar,
    run_batch,
)
from specscale_lab.bench.stack import BenchStack, RealStack
from specscale_lab.calibration.trace import TraceHeader, TraceRequest, trace_request, write_trace

TOY_TASK = "toy"


def add_trace(sub) -> None:
    p = sub.add_parser("trace", help="record a search run's steps, token counts and PRM scores as a trace "
                       "the simulator can fit its workload to (docs/simulator.md)")
    p.add_argument("--out", required=True, help="trace file (JSONL)")
    p.add_argument("--preset", default="best-of-n", help="search preset (best-of-n: unselected samples)")
    p.add_argument("--task", choices=(TOY_TASK, *DATASETS), default=TOY_TASK,
                   help="real models: the toy task or a bundled data set (the simulator has its own problems)")
    p.add_argument("--problems", type=int, default=32)
    p.add_argument("--beam-size", type=int, default=8)
    p.add_argument("--beam-width", type=int, default=4)
    p.add_argument("--max-rounds", type=int, default=None, help="rounds per search (SearchConfig's default: 40)")
    p.add_argument("--max-concurrency", type=int, default=DEFAULT_CONCURRENCY)
    p.add_argument("--seed", type=int, default=0, help="first sampling seed (problem i: paired_seed(seed, i))")
    p.add_argument("--device", default="cpu", help="cpu or cuda (docs/gpu.md)")
    p.add_argument("--no-token-ids", action="store_true", help="leave out token ids (share no text-level detail)")
    p.add_argument("--notes", default="", help="free text for the trace's header")
    add_model_arguments(p)
    add_simulation_arguments(p)
    p.set_defaults(func=run_trace, quick=False)


def run_trace(args) -> int:
    started = time.perf_counter()
    stack, problems, grade = open_trace_stack(args)
    requests = record(stack, args, problems, grade)
    header = trace_header(args, stack)
    stack.close()
    write_trace(args.out, header, requests)
    completed = sum(s.completed for r in requests for s in r.steps)
    print(f"{len(requests)} requests, {completed} completed paths -> {args.out} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


def open_trace_stack(args) -> tuple[BenchStack, list, object]:
    """The stack, the problems (each with `question` and a gold answer) and the grade(answer, gold) to use."""
    if args.backend == "sim" or args.task == TOY_TASK:
        stack = open_stack(args)
        return stack, stack.problems(args.problems), None  # exact match: toy and simulated answers are plain
    stack = RealStack(open_pipeline(args, system_prompt=MATH_SYSTEM_PROMPT))
    grader = shared_grader()
    return stack, load_problems(args.task, args.problems), grader.equivalent


def record(stack: BenchStack, args, problems: list, grade) -> list[TraceRequest]:
    requests = [stack.request(p, preset_config(args.preset, beam_size=args.beam_size, beam_width=args.beam_width,
                                               seed=paired_seed(args.seed, i),
                                               **({"max_rounds": args.max_rounds} if args.max_rounds else {})),
                              f"q{i}") for i, p in enumerate(problems)]
    runtime = fresh_runtime(stack, args.max_concurrency)
    with progress_bar(len(requests), f"trace {args.preset}") as bar:
        run_batch(runtime, requests, bar)
    tokenizer = stack.engine.tokenizer
    return [trace_request(r.request_id, runtime.search(r.request_id), p.question, len(r.prompt_ids), tokenizer,
                          gold_of(p), grade, keep_token_ids=not args.no_token_ids)
            for r, p in zip(requests, problems, strict=True)]


def gold_of(problem) -> str:
    """A data set's `gold`, a toy or simulated problem's `answer`."""
    return getattr(problem, "gold", None) or problem.answer


def trace_header(args, stack: BenchStack) -> TraceHeader:
    described = stack.describe()
    models = described["models"]
    config = preset_config(args.preset, beam_size=args.beam_size, beam_width=args.beam_width)
    return TraceHeader(generator=models["generator"], prm=models["prm"], temperature=config.temperature,
                       search=asdict(config) | {"max_concurrency": args.max_concurrency, "seed": args.seed},
                       source="simulated" if described["backend"] == "sim" else "real",
                       notes=args.notes or f"specscale trace --task {args.task} --preset {args.preset}")
