"""`specscale bench accuracy`: paired-seed accuracy of every variant (docs/BENCHMARKS.md).

Each repeat is one sampling seed; a problem gets the same seed (`paired_seed`) in every variant, so two
variants differ only by their policies. Per (variant, beam size): accuracy of the chosen path, of the
PRM-weighted vote and of the plain majority vote over the returned paths, and the mean and 95% CI of
the difference to `beam` at the same beam size. The CI treats the problem as the unit (the seeds of one
problem are averaged first, since they share its difficulty): mean ± 1.96 standard errors. The share of
(problem, seed) pairs on which a variant chose the same path as `beam` checks the pairing itself. Each run
records its wall time and the most generator KV blocks in use at once (`peak_kv_blocks`; per cell its median).
References, on the same problems and seeds: `single-sample` (one full solution, no PRM) and
`best-of-n` (N full solutions: the PRM's pick, the weighted vote and the plain majority vote).
"""

from __future__ import annotations

import math
import statistics
from statistics import NormalDist
from typing import Any

from specscale.search.presets import preset_config
from specscale_lab.bench.arguments import LADDER, add_common_arguments, search_settings
from specscale_lab.bench.numbers import is_right, vote_is_right
from specscale_lab.bench.outputs import finish_info, markdown_table, new_figure, write_outputs
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run

NAME = "accuracy"
FULL = {"problems": 300, "repeats": 3, "beam_sizes": [8], "max_rounds": 40, "variants": [*LADDER, "fasttts-db", "dvts"]}
QUICK = {"problems": 6, "repeats": 2, "beam_sizes": [4], "max_rounds": 8,
         "variants": ["beam", "naive-spec", "specscale"]}
SINGLE = "single-sample"
BEST_OF_N = "best-of-n"
Z95 = NormalDist().inv_cdf(0.975)
CD_VARIANTS = ("beam+cd", "ep+cd", "specscale")  # computation deduplication: paired with beam by their seeds
CI_TARGET = 0.02  # the 95% CI of a variant's difference to beam must lie inside ±2 points
GAIN_TARGET = 0.15  # beam at N = 8 beats a single sample by at least 15 points


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="paired-seed accuracy, difference to beam with 95%% CI, references")
    add_common_arguments(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    problems = testbed.problems(args.problems)
    cells = [(v, n) for n in args.beam_sizes for v in [*args.variants, BEST_OF_N]] + [(SINGLE, 1)]
    runs = measure(testbed, args, problems, cells)
    testbed.close()
    results = summarize(runs, cells)
    targets = check_targets(results)
    info = finish_info(info, started)
    text = report(results, targets)
    write_outputs(args.out, NAME, info, runs, results, text, plot(results), {"targets": targets})
    print(text)
    return 0


def cell_config(variant: str, n: int, args) -> tuple[str, dict]:
    """The preset and overrides of a cell (the references are best-of-n configurations)."""
    if variant == SINGLE:
        return "best-of-n", {"beam_size": 1, "beam_width": 1}
    if variant == BEST_OF_N:
        width = {"beam_width": args.beam_width} if args.beam_width is not None else {}
        return "best-of-n", {"beam_size": n, **width}
    return variant, search_settings(args, n)


def measure(testbed, args, problems, cells) -> list[dict]:
    """Per seed (repeat) every cell over every problem; one record of 0/1 per problem per run."""
    runs = []
    with progress_bar(len(cells) * args.repeats * len(problems), NAME) as bar:
        for repeat, (variant, n) in interleaved(cells, args.repeats):
            seed = args.seed + repeat
            bar.set_postfix_str(f"seed {seed} {variant} N={n}")
            preset, config = cell_config(variant, n, args)
            requests = search_requests(testbed, problems, preset, seed, tag=f"{variant} N={n} ", **config)
            batch = run_batch(fresh_runtime(testbed, args.max_concurrency), requests, bar)
            runs.append({
                "variant": variant, "beam_size": n, "seed": seed,
                "best": [int(is_right(p, r)) for p, r in zip(problems, batch.results, strict=True)],
                "weighted_vote": [int(vote_is_right(p, r.weighted_vote)) for p, r in zip(problems, batch.results, strict=True)],
                "majority_vote": [int(vote_is_right(p, r.majority_vote)) for p, r in zip(problems, batch.results, strict=True)],
                "answers": [r.answer for r in batch.results],
                "best_paths": [r.best.text if r.best else None for r in batch.results],
                "elapsed_s": batch.elapsed_s,
                "peak_kv_blocks": batch.runtime.metrics.peak_kv_blocks,  # generator KV blocks in use at most
                "generated_tokens": sum(r.usage.generated_tokens for r in batch.results),
                "prm_tokens": sum(batch.runtime.metrics.verifier_batch_tokens),  # PRM input tokens computed
            })
    return runs


def outcomes(runs: list[dict], variant: str, n: int, key: str = "best") -> dict[int, list[int]]:
    """seed -> per-problem 0/1 of one cell."""
    return {r["seed"]: r[key] for r in runs if r["variant"] == variant and r["beam_size"] == n}


def accuracy(by_seed: dict[int, list[int]]) -> float:
    values = [v for seed in by_seed.values() for v in seed]
    return statistics.fmean(values)


def paired_difference(a: dict[int, list[int]], b: dict[int, list[int]]) -> dict:
    """Mean of a - b over problems (each averaged over the seeds both have) with a 95% normal CI."""
    seeds = sorted(set(a) & set(b))
    per_problem = [statistics.fmean(a[s][i] - b[s][i] for s in seeds) for i in range(len(a[seeds[0]]))]
    return dict(mean_ci(per_problem), seeds=len(seeds))


def accuracy_ci(by_seed: dict[int, list[int]]) -> dict:
    """Accuracy over problems (each averaged over its seeds) with a 95% normal CI."""
    seeds = sorted(by_seed)
    per_problem = [statistics.fmean(by_seed[s][i] for s in seeds) for i in range(len(by_seed[seeds[0]]))]
    return dict(mean_ci(per_problem), seeds=len(seeds))


def mean_ci(per_problem: list[float]) -> dict:
    """Mean ± 1.96 standard errors, the problem being the unit (an infinite half-width for one problem)."""
    mean = statistics.fmean(per_problem)
    half = Z95 * statistics.stdev(per_problem) / math.sqrt(len(per_problem)) if len(per_problem) > 1 else math.inf
    return {"mean": mean, "ci95_low": mean - half, "ci95_high": mean + half, "half_width": half,
            "problems": len(per_problem)}


def same_paths(a: dict[int, list], b: dict[int, list]) -> float:
    """Share of (problem, seed) pairs where both cells chose the same path: a check of the pairing
    (with honoured seeds, naive-spec and ep-strict choose exactly beam's paths)."""
    pairs = [(x, y) for seed in set(a) & set(b) for x, y in zip(a[seed], b[seed], strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def summarize(runs: list[dict], cells) -> dict:
    results: dict = {}
    for variant, n in cells:
        cell: dict[str, Any] = {key + "_accuracy": accuracy(outcomes(runs, variant, n, key))
                for key in ("best", "weighted_vote", "majority_vote")}
        cell["peak_kv_blocks"] = statistics.median(r["peak_kv_blocks"] for r in runs
                                                   if (r["variant"], r["beam_size"]) == (variant, n))
        beam = outcomes(runs, "beam", n)
        if variant not in ("beam", SINGLE) and beam:
            cell["difference_to_beam"] = paired_difference(outcomes(runs, variant, n), beam)
            cell["same_best_path_as_beam"] = same_paths(outcomes(runs, variant, n, "best_paths"),
                                                        outcomes(runs, "beam", n, "best_paths"))
        if variant == "beam" and (SINGLE, 1) in cells:
            cell["gain_over_single_sample"] = paired_difference(beam, outcomes(runs, SINGLE, 1))
        results.setdefault(variant, {})[str(n)] = cell
    return results


def promises_beams_paths(variant: str) -> bool:
    """Whether a variant's policies keep beam's selection rule (speculation, pruning, dedup and the timing of
    verification change only the cost), so that its difference to beam is held to the ±2 pp target. DVTS and
    FastTTS are other searches: compared with beam, not held to it (FastTTS's LookAhead head starts change
    which children are sampled, its dynamic branching how many each path gets)."""
    if variant in (SINGLE, BEST_OF_N):
        return False
    config = preset_config(variant)
    return config.selection == "beam" and not config.dynamic_branching and not config.lookahead


def check_targets(results: dict) -> list[dict]:
    """CI of the difference to beam inside ±2 points for each variant that promises beam's paths; beam at
    N = 8 vs one sample."""
    targets = []
    for variant, by_size in results.items():
        if not promises_beams_paths(variant):
            continue
        for n, cell in by_size.items():
            diff = cell.get("difference_to_beam")
            if diff is not None:
                met = diff["ci95_low"] >= -CI_TARGET and diff["ci95_high"] <= CI_TARGET
                targets.append({"target": f"{variant} - beam, N={n}: 95% CI inside ±{CI_TARGET:.0%}",
                                "value": [diff["ci95_low"], diff["ci95_high"]], "met": met})
    gain = results.get("beam", {}).get("8", {}).get("gain_over_single_sample")
    if gain is not None:
        targets.append({"target": f"beam N=8 - single sample ≥ {GAIN_TARGET:.0%}",
                        "value": gain["mean"], "met": gain["mean"] >= GAIN_TARGET})
    return targets


def report(results: dict, targets: list[dict]) -> str:
    rows = []
    for variant, by_size in results.items():
        for n, cell in by_size.items():
            diff = cell.get("difference_to_beam")
            rows.append([variant, int(n), 100 * cell["best_accuracy"], 100 * cell["weighted_vote_accuracy"],
                         100 * cell["majority_vote_accuracy"], None if diff is None else 100 * diff["mean"],
                         None if diff is None else f"[{100 * diff['ci95_low']:+.1f}, {100 * diff['ci95_high']:+.1f}]",
                         None if diff is None else 100 * cell["same_best_path_as_beam"]])
    header = ["variant", "N", "accuracy %", "weighted vote %", "majority %", "Δ beam (pp)", "95% CI (pp)",
              "same path as beam %"]
    text = "\n## Accuracy (paired seeds; CI over problems)\n\n" + markdown_table(header, rows)
    pairing = cd_pairing(results)
    if pairing:
        rows = [[variant, int(n), 100 * share] for (variant, n), share in pairing.items()]
        text += ("\n## CD pairing: share of (problem, seed) on which a CD variant chose beam's path\n\n"
                 + markdown_table(["variant", "N", "same path as beam %"], rows))
    if targets:
        rows = [[t["target"], format_value(t["value"]), "met" if t["met"] else "**missed**"] for t in targets]
        text += "\n## Targets\n\n" + markdown_table(["target", "value", ""], rows)
    return text


def cd_pairing(results: dict) -> dict[tuple[str, str], float]:
    """(CD variant, N) -> share of (problem, seed) pairs where it chose the same path as beam (docs/design.md,
    "Seeds": given equal logits CD changes only the cost, so this should be close to 100%)."""
    return {(variant, n): cell["same_best_path_as_beam"] for variant in CD_VARIANTS
            for n, cell in results.get(variant, {}).items() if "same_best_path_as_beam" in cell}


def format_value(value) -> str:
    if isinstance(value, list):
        return f"[{100 * value[0]:+.1f}, {100 * value[1]:+.1f}] pp"
    return f"{100 * value:+.1f} pp"


def plot(results: dict):
    figure, (levels, differences) = new_figure(1, 2)
    labels = [f"{variant} N={n}" for variant, by_size in results.items() for n in by_size]
    cells = [cell for by_size in results.values() for cell in by_size.values()]
    xs = range(len(cells))
    for offset, key in ((-0.27, "best_accuracy"), (0.0, "weighted_vote_accuracy"), (0.27, "majority_vote_accuracy")):
        levels.bar([x + offset for x in xs], [100 * c[key] for c in cells], 0.27, label=key.removesuffix("_accuracy"))
    levels.set_xticks(list(xs), labels, rotation=45, ha="right")
    levels.set_ylabel("accuracy (%)")
    levels.legend(fontsize=8)
    compared = [(label, c["difference_to_beam"]) for label, c in zip(labels, cells, strict=True) if "difference_to_beam" in c]
    for y, (_, diff) in enumerate(compared):
        low, high = diff["mean"] - diff["ci95_low"], diff["ci95_high"] - diff["mean"]
        differences.errorbar([100 * diff["mean"]], [y], xerr=[[100 * low], [100 * high]], fmt="o", capsize=3)
    differences.axvspan(-100 * CI_TARGET, 100 * CI_TARGET, color="green", alpha=0.15, label="±2 pp")
    differences.axvline(0, color="grey", linewidth=0.8)
    differences.set_yticks(range(len(compared)), [label for label, _ in compared])
    differences.set_xlabel("difference to beam (pp), 95% CI")
    differences.legend(fontsize=8)
    return figure
