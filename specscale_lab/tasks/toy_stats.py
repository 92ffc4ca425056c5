"""Every number of the toy model card, measured with ``transformers`` sampling at T = 0.8.

    python -m specscale_lab.tasks.toy_stats [--quick] [--out DIR] [--problems N] [--seed S]

Full mode uses 300 held-out test problems; ``--quick`` uses 6 (seconds to a minute). Both models are
loaded from ``specscale/assets`` in bf16 (``--generator``/``--prm`` override the folders).

1. Best-of-8: 8 full solutions per problem. Single-sample accuracy, pass@8, majority vote, and the
   PRM's pick (highest ``last`` step score; also ``min``, ``prod`` and the PRM-weighted vote).
2. PRM quality on those samples, labels from the checker: within-problem step AUC (a good and a bad
   step at the same index of the same problem, both after an all-good prefix; ties count one half),
   pooled step AUC, and the fraction of bf16 step scores exactly 1.0. Also, on a clean reference solution
   of each problem and a corrupted copy (``tasks/toy_corrupt.py``: one wrong result, operand, running total,
   operation or box), how often the PRM scores the right step above the corrupted one at the first bad
   step (ties count one half): synthetic errors, harder than the generator's own.
3. Workload: a synchronous beam search (N = 8, M = 4, ``specscale_lab.tasks.toy_rounds``) per problem:
   tokens per step (median, p90), their coefficient of variation within a round, the waiting-time
   ratio 1 - mean/max of step lengths per round, the common-prefix token ratio (1 - token-trie nodes /
   tokens over each sibling group), steps per solution, and the search's accuracy.
4. Difficulty mix: how many problems have 1-2, 3-5 and 6-8 events (``DIFFICULTY_BANDS``; the test split
   draws 1..8 events with toy_core.EVENT_WEIGHTS), and per band the single-sample and beam-search accuracies.

Writes ``toy_stats.json`` under ``--out`` (if given) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from specscale.verify.hf_prm import score_batch
from specscale_lab.tasks.hf_sampling import SamplingSettings, sample_continuations
from specscale_lab.tasks.toy import (
    TOY_GENERATOR_DIR,
    TOY_PRM_DIR,
    ToyProblem,
    extract_answer,
    is_correct,
    label_steps,
    split_steps,
    toy_problems,
)
from specscale_lab.tasks.toy_corrupt import corrupt_steps
from specscale_lab.tasks.toy_models import ToyModels, load_toy_models
from specscale_lab.tasks.toy_rounds import BeamSettings, SearchResult, beam_search
from specscale_lab.tasks.toy_solutions import NO_SLIPS, render_solution

SAMPLES = 8
DIFFICULTY_BANDS = ((1, 2), (3, 5), (6, 8))  # events per problem, inclusive


def sample_solutions(models: ToyModels, problems: list[ToyProblem], n: int, seed: int) -> list[list[str]]:
    """``n`` full solutions (T = 0.8) of every problem, as text."""
    prefixes = [models.prompt(p.question) for p in problems]
    settings = SamplingSettings(max_new_tokens=512, seed=seed)
    outs = sample_continuations(
        models.generator, prefixes, n, [models.gen_tokenizer.eos_token_id], models.gen_tokenizer.pad_token_id, settings
    )
    return [[models.text(ids) for ids in rows] for rows in outs]


def best_of_n_metrics(problems, texts, scores) -> dict[str, float]:
    """Accuracies of one sample, pass@n, majority vote and the PRM's picks, over problems."""
    rows = defaultdict(list)
    for problem, candidates, step_scores in zip(problems, texts, scores, strict=True):
        correct = [is_correct(problem, t) for t in candidates]
        answers = [extract_answer(t) for t in candidates]
        rows["single"].append(float(np.mean(correct)))
        rows["pass_at_n"].append(float(any(correct)))
        rows["majority"].append(float(_vote(answers, [1.0] * len(answers)) == problem.answer))
        rows["prm_weighted_vote"].append(float(_vote(answers, [s[-1] if s else 0.0 for s in step_scores]) == problem.answer))
        for name, aggregate in (("last", lambda s: s[-1]), ("min", min), ("prod", np.prod)):
            values = [float(aggregate(s)) if s else 0.0 for s in step_scores]
            rows[f"prm_{name}"].append(float(correct[int(np.argmax(values))]))
    return {name: float(np.mean(values)) for name, values in rows.items()}


def _vote(answers: list[str | None], weights: list[float]) -> str | None:
    """The answer with the largest total weight (first seen wins ties); None without answers."""
    totals: dict[str, float] = {}
    for answer, weight in zip(answers, weights, strict=True):
        if answer is not None:
            totals[answer] = totals.get(answer, 0.0) + weight
    return max(totals, key=totals.get) if totals else None


def step_metrics(problems, steps, labels, scores) -> dict[str, float]:
    """Within-problem and pooled step AUC, and the fraction of scores exactly 1.0."""
    groups: dict[tuple[int, int], tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    pooled_good: list[float] = []
    pooled_bad: list[float] = []
    for p, per_problem in enumerate(zip(steps, labels, scores, strict=True)):
        for _, label_list, score_list in zip(*per_problem, strict=True):
            for k, (good, score) in enumerate(zip(label_list, score_list, strict=True)):
                (pooled_good if good else pooled_bad).append(score)
                if k == 0 or label_list[k - 1]:
                    groups[(p, k)][0 if good else 1].append(score)
    pairs = [(g, b) for g, b in groups.values() if g and b]
    all_scores = pooled_good + pooled_bad
    return {
        "within_problem_auc": _pairwise_auc(pairs),
        "within_problem_pairs": float(sum(len(g) * len(b) for g, b in pairs)),
        "pooled_auc": _pairwise_auc([(pooled_good, pooled_bad)]),
        "step_scores": float(len(all_scores)),
        "good_step_fraction": len(pooled_good) / max(1, len(all_scores)),
        "perfect_score_fraction": sum(s == 1.0 for s in all_scores) / max(1, len(all_scores)),
    }


def _pairwise_auc(pairs: list[tuple[list[float], list[float]]]) -> float:
    """P(good score > bad score) over all (good, bad) pairs of each group; ties count one half."""
    wins = total = 0.0
    for good, bad in pairs:
        g, b = np.asarray(good)[:, None], np.asarray(bad)[None, :]
        wins += float((g > b).sum() + 0.5 * (g == b).sum())
        total += g.size * b.size
    return wins / total if total else float("nan")


def corrupted_pair_metrics(models: ToyModels, problems: list[ToyProblem], seed: int) -> dict[str, float]:
    """How often the PRM prefers a clean reference step to its corrupted copy, at the first bad step."""
    rng = random.Random(f"corrupted-pairs-{seed}")
    items, first_bad = [], []
    for problem in problems:
        steps = split_steps(render_solution(problem, rng, NO_SLIPS))
        corrupted = corrupt_steps(problem, steps, rng)
        first_bad.append(label_steps(problem, corrupted).index(False))
        items += [(problem.question, steps), (problem.question, corrupted)]
    scores = score_batch(models.prm, models.prm_tokenizer, items)
    wins = [_pairwise_auc([([scores[2 * i][k]], [scores[2 * i + 1][k]])]) for i, k in enumerate(first_bad)]
    return {"corrupted_pair_accuracy": float(np.mean(wins)), "corrupted_pairs": float(len(wins))}


def workload_metrics(results: list[SearchResult], texts: list[list[str]]) -> dict[str, float]:
    """Step lengths, waiting-time and common-prefix ratios of the beam rounds; steps per solution."""
    rounds = [r for result in results for r in result.rounds if len(r.lengths) > 1]
    lengths = [n for r in rounds for n in r.lengths]
    waiting = [1 - statistics.mean(r.lengths) / max(r.lengths) for r in rounds if max(r.lengths)]
    cv = [statistics.pstdev(r.lengths) / statistics.mean(r.lengths) for r in rounds if statistics.mean(r.lengths)]
    unique = sum(_trie_size(group) for r in rounds for group in r.groups)
    steps = [len(split_steps(t)) for candidates in texts for t in candidates]
    return {
        "tokens_per_step_median": float(np.median(lengths)),
        "tokens_per_step_p90": float(np.percentile(lengths, 90)),
        "tokens_per_step_cv_in_round_median": float(np.median(cv)),
        "waiting_ratio_median": float(np.median(waiting)),
        "waiting_ratio_mean": float(np.mean(waiting)),
        "common_prefix_ratio": 1 - unique / max(1, sum(lengths)),
        "steps_per_solution_median": float(np.median(steps)),
        "steps_per_solution_p90": float(np.percentile(steps, 90)),
        "steps_per_solution_mean": float(np.mean(steps)),
        "rounds_per_search_mean": float(np.mean([len(r.rounds) for r in results])),
        "beam_search_accuracy": float(np.mean([is_correct(r.problem, r.answer_text) for r in results])),
    }


def difficulty_metrics(problems, texts, results: list[SearchResult]) -> dict[str, float]:
    """Per band of ``DIFFICULTY_BANDS``: its share of the problems, single-sample and beam accuracy."""
    stats: dict[str, float] = {}
    for low, high in DIFFICULTY_BANDS:
        band = [i for i, p in enumerate(problems) if low <= len(p.ops) <= high]
        single = [np.mean([is_correct(problems[i], t) for t in texts[i]]) for i in band]
        beam = [is_correct(problems[i], results[i].answer_text) for i in band]
        name = f"events_{low}_{high}"
        stats[f"{name}_share"] = len(band) / max(1, len(problems))
        stats[f"{name}_single"] = float(np.mean(single)) if band else float("nan")
        stats[f"{name}_beam_search"] = float(np.mean(beam)) if band else float("nan")
    return stats


def _trie_size(sequences: list[list[int]]) -> int:
    """Nodes of the token trie of ``sequences``: the tokens left after sharing common prefixes."""
    return len({tuple(seq[: i + 1]) for seq in sequences for i in range(len(seq))})


def measure(models: ToyModels, problems: list[ToyProblem], seed: int) -> dict[str, float]:
    """All card numbers for ``problems``."""
    started = time.perf_counter()
    texts = sample_solutions(models, problems, SAMPLES, seed)
    steps = [[split_steps(t) for t in candidates] for candidates in texts]
    queries = [(p.question, s or [""]) for p, cands in zip(problems, steps, strict=True) for s in cands]
    flat_scores = score_batch(models.prm, models.prm_tokenizer, queries)
    scores = [flat_scores[i * SAMPLES : (i + 1) * SAMPLES] for i in range(len(problems))]
    labels = [[label_steps(p, s or [""]) for s in cands] for p, cands in zip(problems, steps, strict=True)]
    stats = {"problems": float(len(problems)), "samples_per_problem": float(SAMPLES)}
    stats |= best_of_n_metrics(problems, texts, scores)
    stats |= step_metrics(problems, steps, labels, scores)
    stats |= corrupted_pair_metrics(models, problems, seed)
    settings = BeamSettings(sampling=SamplingSettings(seed=seed))
    results = beam_search(models, problems, settings)
    stats |= workload_metrics(results, texts)
    stats |= difficulty_metrics(problems, texts, results)
    stats["seconds"] = time.perf_counter() - started
    return stats


def markdown(stats: dict[str, float]) -> str:
    """The statistics as a two-column Markdown table."""
    lines = ["| statistic | value |", "| --- | --- |"]
    for name, value in stats.items():
        shown = f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"
        lines.append(f"| {name} | {shown} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 problems instead of 300")
    parser.add_argument("--problems", type=int, help="number of test problems (default 300, quick 6)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="folder for toy_stats.json")
    parser.add_argument("--generator", type=Path, default=TOY_GENERATOR_DIR)
    parser.add_argument("--prm", type=Path, default=TOY_PRM_DIR)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = args.problems or (6 if args.quick else 300)
    stats = measure(load_toy_models(args.generator, args.prm), toy_problems("test", n, args.seed), args.seed)
    print(markdown(stats))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "toy_stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


if __name__ == "__main__":
    main()
