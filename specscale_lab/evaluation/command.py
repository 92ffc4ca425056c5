"""`specscale eval`: PRM-guided search over a bundled math data set (MATH-500, GSM8K, OlympiadBench),
graded with math-verify, for one or more presets and seeds.

Each (preset, seed) is one batch through a fresh `SearchRuntime`, exactly as `specscale bench` runs
them (many problems in flight, the PRM prefix cache emptied between batches); a problem's sampling seed
is the bench's paired seed of its index in the data set, so presets differ only by their policies. The
generator is prompted with search-and-learn's system prompt in its own chat template; the PRM reads the
question and the steps in its own format. Each finished search is graded (its best answer and both
votes against the gold answer) and appended to the results folder at once; a rerun of the same command
skips what the folder holds (`specscale_lab.evaluation.results`). The final table: `specscale_lab.evaluation.report`.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path

from specscale.cli import UsageError, interrupted_status
from specscale.config import SearchConfig
from specscale.former_flag import add_former_name
from specscale.grading import DATASETS, AnswerGrader, Problem, load_problems, shared_grader
from specscale.pipeline import PipelineConfig
from specscale.prompts import MATH_SYSTEM_PROMPT
from specscale.search.presets import PRESETS, parse_variant, preset_config, split_variants
from specscale.search.result import SearchResult
from specscale.vllm_backend.selection import add_backend_arguments, chosen_backends
from specscale_lab.bench.arguments import DEFAULT_CONCURRENCY, add_model_arguments, given_search_flags
from specscale_lab.bench.outputs import command_line, finish_info, run_info
from specscale_lab.bench.runs import fresh_runtime, open_pipeline, paired_seed, real_stack_description, run_batch
from specscale_lab.bench.testbed import RealTestbed
from specscale_lab.cli_checks import check_model_folders, check_search_settings
from specscale_lab.evaluation.progress import Progress
from specscale_lab.evaluation.report import markdown, summarize
from specscale_lab.evaluation.results import ResultsFolder

NAME = "eval"
GRADE_TIMEOUT_S = 5.0  # math-verify's default per comparison; a longer one counts as wrong


def add_eval(sub) -> None:
    p = sub.add_parser(NAME, help="accuracy on MATH-500 / GSM8K / OlympiadBench with math-verify grading "
                       "(resumable JSONL records, table with 95%% CIs)")
    p.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    p.add_argument("--problems", type=int, default=None, help="the first N problems (default: all)")
    presets = p.add_argument("--presets", type=split_variants, default=["specscale"],
                             help="comma-separated presets, each optionally with SearchConfig fields changed "
                                  "(preset[field=value,...]), compared paired with the first (default: specscale)")
    add_former_name(p, "--preset", presets)  # eval's name before `bench --presets` was the one name
    p.add_argument("--beam-size", type=int, default=None, help="N (default: each preset's)")
    p.add_argument("--beam-width", type=int, default=None, help="M, children per retained path (default: each preset's)")
    p.add_argument("--max-rounds", type=int, default=None, help="rounds per search (default: each preset's)")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--max-step-tokens", type=int, default=SearchConfig.max_step_tokens)
    p.add_argument("--filter-duplicates", action="store_true", default=None,
                   help="identical paths compete as one in selection (search-and-learn's recipes' option)")
    p.add_argument("--seeds", type=int, default=1, help="sampling seeds per problem")
    p.add_argument("--seed", type=int, default=0, help="first sampling seed")
    p.add_argument("--system-prompt", default=None, help="generator system prompt (default: search-and-learn's)")
    p.add_argument("--out", default=None, help="results folder (default: results/eval-<dataset>)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--max-concurrency", type=int, default=DEFAULT_CONCURRENCY, help="searches in flight at most")
    add_model_arguments(p)
    add_backend_arguments(p)  # as `solve`: --backend engine|vllm, --generator-backend, --verifier-backend, --vllm-arg
    p.set_defaults(func=run_eval, quick=False)


def run_eval(args) -> int:
    check_arguments(args)
    problems = load_problems(args.dataset, args.problems)
    seeds = list(range(args.seed, args.seed + args.seeds))
    results = ResultsFolder(args.out or f"results/eval-{args.dataset}", settings(args))
    grader = shared_grader()
    pending = pending_cells(results, problems, args.presets, seeds)
    started = time.perf_counter()
    if not pending:
        info = recorded_run(args)
    else:
        grader.start()  # math-verify's imports overlap the model loading
        pipeline = open_pipeline(args, device=args.device, system_prompt=args.system_prompt or MATH_SYSTEM_PROMPT)
        info = recorded_run(args, RealTestbed(pipeline))
        try:
            run_cells(pipeline, args, results, pending, grader)
        except KeyboardInterrupt as interrupt:
            print(f"\nspecscale eval: interrupted: {len(results.records)} searches are in {results.path}; "
                  "run the same command again to resume", file=sys.stderr)
            return interrupted_status(interrupt)
        finally:
            pipeline.close()
    summary = summarize(results.records, results.batches, problems, args.presets, seeds)
    info = dict(finish_info(info, started), grading=dataclasses.asdict(grader.stats), device=args.device)
    text = report_markdown(info, summary, args)
    results.write_summary({"run": info, "settings": settings(args), "results": summary}, text)
    print(text)
    return 0


def recorded_run(args, testbed: RealTestbed | None = None) -> dict:
    """`run_info` with eval's command line: bench's recording leaves `--dataset` out (there it names a simulated
    workload, which a real run does not read); here it is which problems were run."""
    info = run_info(NAME, args, testbed, command="specscale")
    words = shlex.split(command_line(NAME, args, "specscale"))
    return dict(info, command=shlex.join([*words[:2], "--dataset", args.dataset, *words[2:]]))


def check_arguments(args) -> None:
    """Everything a command line can get wrong, each a one-line UsageError, before anything loads."""
    unknown = [p for p in args.presets if parse_variant(p)[0] not in PRESETS]
    if unknown or not args.presets:
        raise UsageError(f"--presets: unknown preset(s) {', '.join(unknown)}; choose from {', '.join(sorted(PRESETS))}")
    if args.seeds < 1 or (args.problems is not None and args.problems < 1):
        raise UsageError(f"--seeds and --problems must be >= 1, got {args.seeds} and {args.problems}")
    check_model_folders(args)
    real_stack_description(args, PipelineConfig())  # vLLM missing, a bad --vllm-arg
    for preset in args.presets:  # SearchConfig's own checks (beam size a multiple of width...)
        check_search_settings(preset, {**given_search_flags(args), "temperature": args.temperature,
                                       "max_step_tokens": args.max_step_tokens})


def settings(args) -> dict:
    """What a record's meaning depends on; a results folder holds one setting only. The search's size is the
    first preset's, with the flags given."""
    first = search_config(args, args.presets[0], 0)
    return {"dataset": args.dataset, "generator": str(Path(args.generator).resolve()),
            "prm": str(Path(args.prm).resolve()), "dtype": args.dtype, "beam_size": first.beam_size,
            "beam_width": first.beam_width, "max_rounds": first.max_rounds, "temperature": args.temperature,
            "max_step_tokens": args.max_step_tokens,
            "filter_duplicates": first.filter_duplicates, "system_prompt": args.system_prompt or MATH_SYSTEM_PROMPT,
            **backend_settings(args)}


def backend_settings(args) -> dict:
    """Which engine ran each model, where one is vLLM (a folder of our engine's records keeps its settings)."""
    generator, verifier = chosen_backends(args)
    if generator == verifier == "engine":
        return {}
    return {"generator_backend": generator, "verifier_backend": verifier, "vllm_args": sorted(args.vllm_arg)}


def search_config(args, preset: str, seed: int) -> SearchConfig:
    try:
        return preset_config(preset, temperature=args.temperature, max_step_tokens=args.max_step_tokens, seed=seed,
                             **given_search_flags(args))
    except ValueError as error:
        raise SystemExit(f"bad search settings: {error}") from None


def pending_cells(results: ResultsFolder, problems: list[Problem], presets: list[str],
                  seeds: list[int]) -> list[tuple[str, int, list[Problem]]]:
    """(preset, seed, problems the folder lacks) in run order: seed by seed, so that an interrupted run
    already holds every preset of its first seeds (paired comparisons need them all)."""
    done = results.done()
    cells = [(preset, seed, [p for p in problems if (preset, seed, p.problem_id) not in done])
             for seed in seeds for preset in presets]
    return [cell for cell in cells if cell[2]]


def run_cells(pipeline, args, results: ResultsFolder, cells, grader: AnswerGrader) -> None:
    with Progress(sum(len(todo) for _, _, todo in cells), NAME) as progress:
        for preset, seed, todo in cells:
            progress.note(f"{preset} seed {seed}")
            run_cell(pipeline, args, results, preset, seed, todo, grader, progress)


def run_cell(pipeline, args, results: ResultsFolder, preset: str, seed: int, todo: list[Problem],
             grader: AnswerGrader, progress: Progress) -> None:
    """One preset and seed over the problems it lacks; each search is recorded as it finishes."""
    by_id = {f"{preset} seed={seed} {p.problem_id}": p for p in todo}
    requests = [pipeline.request(p.question, search_config(args, preset, paired_seed(seed, p.index)), request_id)
                for request_id, p in by_id.items()]

    def record(request_id: str, result: SearchResult) -> None:
        results.add_record(problem_record(by_id[request_id], preset, seed, result, grader))

    runtime = fresh_runtime(pipeline, args.max_concurrency, on_finished=record)
    try:
        batch = run_batch(runtime, requests, progress)
    except KeyboardInterrupt:
        for request_id in by_id:  # frees the searches' KV at once; what is cancelled now is not a result
            runtime.cancel(request_id, notify=False)
        raise
    results.add_batch({"preset": preset, "seed": seed, "searches": len(todo), "elapsed_s": batch.elapsed_s,
                       "output_tokens": sum(r.usage.output_tokens for r in batch.results),
                       "generated_tokens": sum(r.usage.generated_tokens for r in batch.results)})


def problem_record(problem: Problem, preset: str, seed: int, result: SearchResult, grader: AnswerGrader) -> dict:
    """One search, graded: the answer of its best path and both votes against the gold answer."""
    answers = {"best": result.answer, "weighted_vote": result.weighted_vote, "majority_vote": result.majority_vote}
    return {
        "dataset": problem.dataset, "problem_id": problem.problem_id, "problem_index": problem.index,
        "preset": preset, "seed": seed, "gold": problem.gold, "answer": result.answer,
        "weighted_vote": result.weighted_vote, "majority_vote": result.majority_vote,
        "correct": {kind: answer is not None and grader.equivalent(problem.gold, answer, GRADE_TIMEOUT_S)
                    for kind, answer in answers.items()},
        "paths": [{"answer": p.answer, "score": p.score, "copies": p.copies, "tokens": p.num_tokens}
                  for p in result.paths],
        "best_text": result.best.text if result.best else None,
        "tokens": dataclasses.asdict(result.usage), "timings": dataclasses.asdict(result.timings),
        "rounds": result.rounds, "error": result.error,
    }


def report_markdown(info: dict, summary: dict, args) -> str:
    grading, first = info["grading"], search_config(args, args.presets[0], 0)
    return (f"# specscale eval {args.dataset}\n\n```bash\n{info['command']}\n```\n\n"
            f"commit `{info['git_commit']}`, {info['machine']['cpu']}, device {args.device}, "
            f"{info.get('duration_s', 0.0):.0f} s this session. N = {first.beam_size}, M = {first.beam_width}, "
            f"T = {args.temperature}, {first.max_rounds} rounds, {args.seeds} seed(s). Grading: math-verify, "
            f"{grading['math_verify']} comparisons, {grading['timeouts']} timed out.\n\n"
            + markdown(summary, args.presets[0]))
