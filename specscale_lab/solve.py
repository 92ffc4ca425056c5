"""`specscale solve`: run a search preset over questions (default: held-out toy problems) and report.

This is the project's main job on the bundled models: it prints each answer, the accuracy, output
tokens per second and where the time went. The `searches:` progress bar is drawn on a terminal only
(stderr a TTY), so that a piped or logged run stays one line per answer plus the summary.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from specscale.composition import build_stack
from specscale.config import KERNEL_MODES
from specscale.pipeline import PipelineConfig
from specscale.preset_argument import preset_argument
from specscale.search.presets import PRESETS, preset_config
from specscale.usage_error import UsageError
from specscale.vllm_backend.engine_args import VllmBackendError
from specscale.vllm_backend.selection import add_backend_arguments, stack_description
from specscale_lab.bench.arguments import given_search_flags
from specscale_lab.cli_checks import check_model_folders, check_search_settings, non_empty_question
from specscale_lab.tasks.toy import is_correct, toy_problems


def add_solve(sub) -> None:
    p = sub.add_parser("solve", help="solve questions with PRM-guided search (default: toy test problems)")
    p.add_argument("--preset", default="specscale", type=preset_argument,
                   help=f"a preset or preset[field=value,...] (presets: {', '.join(sorted(PRESETS))})")
    p.add_argument("--question", action="append", type=non_empty_question, help="a question (repeatable); default: toy test problems")
    p.add_argument("--problems", type=int, default=16, help="how many toy test problems")
    p.add_argument("--beam-size", type=int, default=None, help="N (default: the preset's)")
    p.add_argument("--beam-width", type=int, default=None, help="M, children per retained path (default: the preset's)")
    p.add_argument("--max-rounds", type=int, default=None, help="rounds per search (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--filter-duplicates", action="store_true", default=None,
                   help="identical paths compete as one in selection (search-and-learn's option; docs/design.md)")
    p.add_argument("--generator", default=PipelineConfig.generator)
    p.add_argument("--prm", default=PipelineConfig.prm)
    p.add_argument("--max-concurrency", type=int, default=32)
    p.add_argument("--device", default=PipelineConfig.device, help="cpu or cuda")
    p.add_argument("--kernels", default="auto", choices=KERNEL_MODES, help="CPU linear kernels: auto (the fastest measured on this machine), or force ours / onednn / transposed / torch")
    p.add_argument("--quiet", action="store_true", help="one line per question (its answer), then the summary")
    add_backend_arguments(p)  # --backend engine|vllm, --generator-backend, --verifier-backend, --vllm-arg
    p.set_defaults(func=run_solve)


def run_counting(runtime, requests: list, bar: tqdm) -> list:
    """runtime.run with the bar; an interrupt says how many searches had finished (`cli.py` prints it)."""
    finished = 0

    def advance(count: int) -> None:
        nonlocal finished
        finished += count
        bar.update(count)

    try:
        return runtime.run(requests, progress=advance)
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM (cli.Terminated): the same kind, with the count
        raise type(interrupt)(f"after {finished} of {len(requests)} searches") from None


def run_solve(args) -> int:
    check_model_folders(args)
    search_flags = given_search_flags(args)
    check_search_settings(args.preset, search_flags)
    pipeline_config = PipelineConfig(generator=args.generator, prm=args.prm, max_concurrency=args.max_concurrency,
                                     device=args.device, kernels=args.kernels)
    print(f"specscale solve: loading {args.generator} and {args.prm} ({args.preset}; a first start on this machine "
      "also compiles kernels and profiles the PRM)", file=sys.stderr, flush=True)
    try:
        pipeline = build_stack(stack_description(args, pipeline_config))
    except VllmBackendError as error:  # vLLM missing, a bad --vllm-arg, a model vLLM cannot run: one line
        raise UsageError(str(error)) from None
    problems = None if args.question else toy_problems("test", args.problems, seed=args.seed)
    questions = args.question or [p.question for p in problems]
    requests = []
    for i, question in enumerate(questions):
        config = preset_config(args.preset, seed=args.seed * 100_003 + i, **search_flags)
        requests.append(pipeline.request(question, config, request_id=f"q{i}"))
    runtime = pipeline.runtime()
    start = time.perf_counter()
    with tqdm(total=len(requests), desc="searches", unit="req", disable=None) as bar:  # None: off unless a TTY
        results = run_counting(runtime, requests, bar)
    elapsed = time.perf_counter() - start
    correct = 0
    for i, (question, result) in enumerate(zip(questions, results, strict=True)):
        problem = problems[i] if problems is not None else None
        ok = problem is not None and result.best is not None and is_correct(problem, result.best.text)
        correct += ok
        print(answer_line(question, result, problem, ok, args.quiet))
    report(runtime.metrics.summary(), results, elapsed, correct if problems is not None else None, args.preset)
    pipeline.close()
    return 0


def answer_line(question: str, result, problem, ok: bool, quiet: bool) -> str:
    """What `solve` prints for one question: the question and the answer with its weighted vote, or
    with ``quiet`` the answer alone on one line; a verdict when the true answer is known."""
    verdict = "" if problem is None else ("  [correct]" if ok else f"  [wrong; true {problem.answer}]")
    if quiet:
        return f"answer: {result.answer}{verdict}"
    return f"### {question}\nanswer: {result.answer}  (weighted vote {result.weighted_vote}){verdict}\n"


def report(metrics: dict, results, elapsed: float, correct: int | None, preset: str) -> None:
    """metrics: the runtime's `RunMetrics.summary()`."""
    output = sum(r.usage.output_tokens for r in results)
    generated = sum(r.usage.generated_tokens for r in results)
    print(f"preset {preset}: {len(results)} requests in {elapsed:.1f} s")
    if correct is not None:
        print(f"accuracy {correct}/{len(results)} = {correct / len(results):.1%}")
    print(f"output tokens/s {output / elapsed:.0f}   generated tokens/s {generated / elapsed:.0f}   "
          f"wasted {sum(r.usage.wasted_tokens for r in results)} tokens")
    print(f"time: generation {metrics['generation_s']:.1f} s, verification {metrics['verification_s']:.1f} s, "
          f"other {elapsed - metrics['generation_s'] - metrics['verification_s']:.1f} s; "
          f"PRM calls {metrics['verifier_calls']}, physical/logical {metrics['physical_to_logical']:.2f}")
