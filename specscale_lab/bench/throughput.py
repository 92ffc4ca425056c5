"""`specscale bench throughput`: the ablation ladder under load (docs/BENCHMARKS.md).

Per repeat, every (variant, beam size) cell serves the same toy problems with the same paired seeds,
all requests issued at once with at most `--max-concurrency` in flight; the cells run one after the
other in an order rotated from repeat to repeat. Reported per cell (medians over repeats): output
tokens/s (tokens of the returned paths), answer tokens/s (the selected path's only), requests/s, correct
answers/s, generated tokens/s, the time split, the share of generated tokens cancelled, and the PRM calls:
how many, their median tokens, the requests each holds on average and why lazy batches were flushed.
Speed-ups of `specscale` over `beam`, the controls, `naive-spec` and `fasttts`, in output tokens/s and in
requests/s (variants return paths of different lengths), are the medians of the per-repeat ratios (both
runs of a ratio come from the same repeat), checked against the issues' targets.

A load sweep (issue 44 §4): `--max-concurrency 1,2,4,8,32` runs the whole ladder at each level (every run of a
level with at most that many requests in flight), with `--problems` one count for every level or one per level
(`--problems 16,16,32,64,64`). It writes one table, rows the variants (per beam size), per level the output
tokens/s and the ratios to `beam` (the first variant when `beam` is not run) in output tokens/s and in
requests/s, each the median of the per-repeat ratios; below it each level's own tables and targets, as a
single level writes them. summary.json: `results[level][variant][beam size]`, `speedups[level]` and
`load_sweep` (the table's numbers). One level writes exactly what it always did.
"""

from __future__ import annotations

import argparse
import statistics

from specscale.usage_error import UsageError
from specscale_lab.bench.arguments import LADDER, add_common_arguments, search_settings
from specscale_lab.bench.cell_pool import CellPool, add_workers_argument, resolve_workers
from specscale_lab.bench.numbers import median_summary, serving_numbers
from specscale_lab.bench.outputs import finish_info, flush_text, markdown_table, new_figure, write_outputs
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run

NAME = "throughput"
FULL = {"problems": 64, "repeats": 3, "beam_sizes": [4, 8], "max_rounds": 40, "variants": list(LADDER)}
QUICK = {"problems": 4, "repeats": 3, "beam_sizes": [4, 8], "max_rounds": 8, "variants": list(LADDER)}
# (numerator, denominator, beam size, minimum ratio): the targets
TARGETS = (
    ("specscale", "beam", 8, 1.35),
    ("specscale", "beam", 4, 1.35),
    ("specscale", "beam+cd", 8, 1.0),
    ("specscale", "beam+cd", 4, 1.0),
    ("specscale", "beam+cd+lv", 8, 1.0),
    ("specscale", "beam+cd+lv", 4, 1.0),
    ("specscale", "specscale-nospec", 8, 1.0),
    ("specscale", "specscale-nospec", 4, 1.0),
    ("specscale", "naive-spec", 8, 2.0),
    ("specscale", "naive-spec", 4, 2.0),
    ("specscale", "fasttts", 8, 1.8),
    ("specscale", "fasttts", 4, 1.8),
)
TABLE_METRICS = (
    ("output tok/s", "output_tokens_per_s"), ("answer tok/s", "answer_tokens_per_s"), ("req/s", "requests_per_s"),
    ("correct/s", "correct_per_s"), ("generated tok/s", "generated_tokens_per_s"), ("accuracy", "accuracy"),
    ("gen s", "generation_s"), ("PRM s", "verification_s"), ("other s", "other_s"),
    ("cancelled share", "wasted_share"), ("PRM calls", "verifier_calls"),
    ("PRM tok/call", "verifier_batch_tokens_median"), ("req/call", "verifier_batch_requests_mean"),
    ("phys/log", "physical_to_logical"),
)
RATIO_METRICS = (("output tok/s", "output_tokens_per_s"), ("req/s", "requests_per_s"))


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="output-token throughput of the ablation ladder, all requests at once")
    add_common_arguments(parser, load_sweep=True)
    add_workers_argument(parser)
    parser.set_defaults(func=run)


def run(args) -> int:
    levels, counts = load_levels(args)
    if levels is not None and len(levels) > 1:
        return run_sweep(args, levels, counts)
    args.max_concurrency = levels[0] if levels else None  # one level: the single run, as it always was
    args.problems = counts[0] if counts else None
    return run_level(args)


def load_levels(args) -> tuple[list[int] | None, list[int] | None]:
    """--max-concurrency's levels and --problems' counts as given (lists; None where left unset): one count, or
    one per level."""
    levels, counts = as_list(args.max_concurrency), as_list(args.problems)
    if levels is not None and len(set(levels)) < len(levels):
        raise UsageError(f"--max-concurrency {joined(levels)}: each level once")
    given = len(levels) if levels is not None else 1
    if counts is not None and len(counts) not in (1, given):
        raise UsageError(f"--problems {joined(counts)}: {len(counts)} counts for {given} --max-concurrency "
                         f"level{'s' if given != 1 else ''}; give one count for every level, or one per level")
    return levels, counts


def joined(values: list[int]) -> str:
    return ",".join(map(str, values))


def as_list(value: int | list[int] | None) -> list[int] | None:
    return None if value is None else value if isinstance(value, list) else [value]


def run_level(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    problems = testbed.problems(args.problems)
    cells = [(variant, n) for n in args.beam_sizes for variant in args.variants]
    args.workers = resolve_workers(args, len(cells) * args.repeats)
    runs = measure(testbed, args, problems, cells)
    testbed.close()
    results = summarize(runs, cells)
    ratios = speedups(runs, args.repeats)
    info = finish_info(info, started)
    write_outputs(args.out, NAME, info, runs, results, report(results, ratios, args.beam_sizes),
                  plot(results, args.variants, args.beam_sizes), {"speedups": ratios})
    print(report(results, ratios, args.beam_sizes))
    return 0


def measure(testbed, args, problems, cells) -> list[dict]:
    """Every cell once per repeat, interleaved; one record per run. Simulated cells run each on a fresh
    simulation, in `--workers` processes (bench/cell_pool.py); real ones one after the other on `testbed`."""
    runs = list(interleaved(cells, args.repeats))
    with progress_bar(len(runs) * len(problems), NAME) as bar:
        if args.backend == "sim":
            return CellPool(args.workers).run(run_cell, args, runs, bar, label=cell_label, weight=cell_weight)
        records = []
        for run in runs:
            bar.set_postfix_str(cell_label(run))
            records.append(run_cell(testbed, args, run, bar, problems))
        return records


def run_cell(testbed, args, run: tuple[int, tuple[str, int]], progress, problems=None) -> dict:
    """One repeat of one (variant, beam size) cell on `testbed`: every problem issued at once."""
    repeat, (variant, n) = run
    problems = problems if problems is not None else testbed.problems(args.problems)
    requests = search_requests(testbed, problems, variant, args.seed, **search_settings(args, n))
    batch = run_batch(fresh_runtime(testbed, args.max_concurrency), requests, progress)
    record = {"variant": variant, "beam_size": n, "repeat": repeat, **serving_numbers(batch, problems)}
    if getattr(args, "sweep_level", False):  # a load sweep's run says the load it ran under
        record |= {"max_concurrency": batch.runtime.max_concurrency, "problems": len(problems)}
    return record


def cell_label(run: tuple[int, tuple[str, int]]) -> str:
    repeat, (variant, n) = run
    return f"repeat {repeat} {variant} N={n}"


def cell_weight(run: tuple[int, tuple[str, int]]) -> float:
    """Simulation work grows with the beam size: larger N first."""
    return run[1][1]


def summarize(runs: list[dict], cells) -> dict:
    """results[variant][beam size] = medians over repeats, plus the per-repeat output tokens/s."""
    results: dict = {}
    for variant, n in cells:
        mine = [r for r in runs if r["variant"] == variant and r["beam_size"] == n]
        cell = median_summary(mine)
        cell.pop("repeat", None)
        cell["output_tokens_per_s_repeats"] = [r["output_tokens_per_s"] for r in mine]
        results.setdefault(variant, {})[str(n)] = cell
    return results


def speedups(runs: list[dict], repeats: int) -> list[dict]:
    """Each target's ratio in each of RATIO_METRICS: the median over repeats of numerator / denominator
    within one repeat."""
    out = []
    for title, key in RATIO_METRICS:
        rate = {(r["variant"], r["beam_size"], r["repeat"]): r[key] for r in runs}
        for top, bottom, n, target in TARGETS:
            per_repeat = [rate[(top, n, i)] / rate[(bottom, n, i)] for i in range(repeats)
                          if (top, n, i) in rate and (bottom, n, i) in rate]
            if per_repeat:
                ratio = statistics.median(per_repeat)
                out.append({"ratio": f"{top} / {bottom}", "metric": title, "beam_size": n, "median": ratio,
                            "repeats": per_repeat, "target": target, "met": ratio >= target})
    return out


def report(results: dict, ratios: list[dict], beam_sizes: list[int]) -> str:
    text = ""
    for n in beam_sizes:
        cells = [(variant, results[variant][str(n)]) for variant in results if str(n) in results[variant]]
        rows = [[variant] + [cell[key] for _, key in TABLE_METRICS] + [flush_text(cell.get("flush_reasons"))]
                for variant, cell in cells]
        header = ["variant"] + [title for title, _ in TABLE_METRICS] + ["lazy flushes (median per run)"]
        text += f"\n## N = {n} (medians over repeats)\n\n" + markdown_table(header, rows)
    if ratios:
        rows = [[r["ratio"], r["metric"], r["beam_size"], r["median"], min(r["repeats"]), max(r["repeats"]),
                 f"≥ {r['target']}", "met" if r["met"] else "**missed**"] for r in ratios]
        text += "\n## Targets (median of per-repeat ratios)\n\n"
        text += markdown_table(["ratio", "metric", "N", "median", "min", "max", "target", ""], rows)
    return text


def plot(results: dict, variants: list[str], beam_sizes: list[int]):
    figure, (speed, split) = new_figure(1, 2, width=7.0)
    width = 0.8 / len(beam_sizes)
    for j, n in enumerate(beam_sizes):
        xs = [i + j * width for i in range(len(variants))]
        cells = [results[v][str(n)] for v in variants]
        low = [c["output_tokens_per_s"] - min(c["output_tokens_per_s_repeats"]) for c in cells]
        high = [max(c["output_tokens_per_s_repeats"]) - c["output_tokens_per_s"] for c in cells]
        speed.bar(xs, [c["output_tokens_per_s"] for c in cells], width, yerr=[low, high], label=f"N = {n}")
    speed.set_xticks([i + width * (len(beam_sizes) - 1) / 2 for i in range(len(variants))], variants, rotation=45,
                     ha="right")
    speed.set_ylabel("output tokens / s (median, min–max)")
    speed.legend()
    n = max(beam_sizes)
    bottom = [0.0] * len(variants)
    parts = ("generation_s", "verification_s", "other_s")
    totals = [sum(results[v][str(n)][part] for part in parts) for v in variants]
    for part in parts:
        share = [results[v][str(n)][part] / total for v, total in zip(variants, totals, strict=True)]
        split.bar(variants, share, bottom=bottom, label=part.removesuffix("_s"))
        bottom = [b + s for b, s in zip(bottom, share, strict=True)]
    split.set_ylabel(f"share of wall time, N = {n}")
    split.tick_params(axis="x", rotation=45)
    split.legend()
    return figure


# ---- the load sweep: the ladder at each --max-concurrency level, one table ----------------------------------
SWEEP_RATIOS = (("output_tokens_per_s", "out tok/s"), ("requests_per_s", "req/s"))  # the sweep's ratio metrics
REFERENCE = "beam"  # the sweep's ratios are to it, or to the first variant when it is not run


def run_sweep(args, levels: list[int], counts: list[int] | None) -> int:
    """The ladder at each level, one level after the other (within a level the runs interleave as in a single
    run); `counts`: --problems per level (None: the mode's default for every level)."""
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    counts = level_counts(levels, counts, args.problems)
    cells = [(variant, n) for n in args.beam_sizes for variant in args.variants]
    workers = resolve_workers(args, len(cells) * args.repeats)
    runs: list[dict] = []
    results: dict[str, dict] = {}
    ratios: dict[str, list[dict]] = {}
    for level, count in zip(levels, counts, strict=True):
        level_args = argparse.Namespace(**{**vars(args), "max_concurrency": level, "problems": count,
                                           "workers": workers, "sweep_level": True})
        level_runs = measure(testbed, level_args, testbed.problems(count), cells)
        runs += level_runs
        results[str(level)] = summarize(level_runs, cells)
        ratios[str(level)] = speedups(level_runs, args.repeats)
    testbed.close()
    sweep = load_sweep(runs, levels, counts, cells, args.repeats, reference_variant(args.variants))
    info = finish_info(info, started)
    text = sweep_report(sweep, results, ratios, args.beam_sizes)
    write_outputs(args.out, NAME, info, runs, results, text, sweep_plot(sweep, args.beam_sizes),
                  {"speedups": ratios, "load_sweep": sweep})
    print(text)
    return 0


def level_counts(levels: list[int], counts: list[int] | None, default: int) -> list[int]:
    """Problems per level: one per level as given, one count repeated, or the mode's default for each."""
    if counts is None:
        return [default] * len(levels)
    return counts if len(counts) == len(levels) else counts * len(levels)


def reference_variant(variants: list[str]) -> str:
    return REFERENCE if REFERENCE in variants else variants[0]


def load_sweep(runs: list[dict], levels: list[int], counts: list[int], cells, repeats: int, reference: str) -> dict:
    """The sweep table's numbers: per (variant, beam size) and level, the median output tokens/s and requests/s
    over repeats and, per metric of SWEEP_RATIOS, the median over repeats of the run's rate / the reference's
    in the same repeat, level and beam size (and the per-repeat ratios)."""
    rate = {(r["max_concurrency"], r["variant"], r["beam_size"], r["repeat"]): r for r in runs}
    rows = []
    for variant, n in sorted(cells, key=lambda cell: cell[1]):
        by_level: dict[str, dict] = {}
        for level in levels:
            mine = [rate[(level, variant, n, i)] for i in range(repeats) if (level, variant, n, i) in rate]
            cell: dict = {key: statistics.median(r[key] for r in mine) for key, _ in SWEEP_RATIOS}
            for key, _ in SWEEP_RATIOS:
                per_repeat = [rate[(level, variant, n, i)][key] / rate[(level, reference, n, i)][key]
                              for i in range(repeats) if (level, variant, n, i) in rate and (level, reference, n, i) in rate]
                cell[f"{key}_ratio"] = statistics.median(per_repeat) if per_repeat else None
                cell[f"{key}_ratio_repeats"] = per_repeat
            by_level[str(level)] = cell
        rows.append({"variant": variant, "beam_size": n, "levels": by_level})
    return {"levels": levels, "problems": counts, "repeats": repeats, "reference": reference, "rows": rows}


def sweep_table(sweep: dict) -> str:
    """The one table: a row per variant and beam size; per level, output tokens/s and its ratio to the reference
    and the requests/s ratio (medians of per-repeat ratios)."""
    reference = sweep["reference"]
    header = ["variant", "N"]
    for level in sweep["levels"]:
        header += [f"{level} in flight: out tok/s", f"÷ {reference}", f"÷ {reference} (req/s)"]
    rows = []
    for row in sweep["rows"]:
        cells: list = [row["variant"], row["beam_size"]]
        for level in sweep["levels"]:
            cell = row["levels"][str(level)]
            cells += [cell["output_tokens_per_s"], cell["output_tokens_per_s_ratio"], cell["requests_per_s_ratio"]]
        rows.append(cells)
    return markdown_table(header, rows)


def sweep_report(sweep: dict, results: dict, ratios: dict, beam_sizes: list[int]) -> str:
    levels, counts = sweep["levels"], sweep["problems"]
    problems = (f"{counts[0]} problems at every level" if len(set(counts)) == 1
                else "problems per level " + ", ".join(f"{c} at {level}" for level, c in zip(levels, counts, strict=True)))
    repeats = sweep["repeats"]
    text = (f"\n## Load sweep: at most {', '.join(map(str, levels))} requests in flight\n\n"
            f"{problems}; {repeats} repeat{'s' if repeats != 1 else ''}, "
            f"{'medians over repeats, ratios the median of per-repeat ratios' if repeats > 1 else 'one run a cell'}.\n\n"
            + sweep_table(sweep))
    for level, count in zip(levels, counts, strict=True):
        level_text = report(results[str(level)], ratios[str(level)], beam_sizes).replace("\n## ", "\n### ")
        text += f"\n## At most {level} in flight ({count} problems)\n" + level_text
    return text


def sweep_plot(sweep: dict, beam_sizes: list[int]):
    """Per beam size: each variant's output tokens/s ratio to the reference against the load."""
    figure, axes = new_figure(1, len(beam_sizes), width=5.0)
    levels = sweep["levels"]
    for axis, n in zip(axes, beam_sizes, strict=True):
        for row in (r for r in sweep["rows"] if r["beam_size"] == n):
            ratios = [row["levels"][str(level)]["output_tokens_per_s_ratio"] for level in levels]
            axis.plot(levels, ratios, marker="o", label=row["variant"])
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.set_xlabel("requests in flight at most")
        axis.set_ylabel(f"output tok/s ÷ {sweep['reference']} (N = {n})")
        axis.legend(fontsize="small")
    return figure
