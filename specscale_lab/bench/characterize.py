"""`specscale bench characterize`: where the time goes and why (docs/BENCHMARKS.md).

1. Waiting at batch size 1: `beam` serving one request at a time; per request, the share of its
   candidates' time spent finished and waiting for the round to be decided (idle / (idle + busy)),
   overall, as a median over requests and by difficulty (events in a toy problem, a simulated one's level).
2. The ladder under load (all requests at once, `--max-concurrency` in flight), per variant and beam
   size: time split (generation / verification / other), verifier batch sizes (paths and PRM tokens
   per call), PRM tokens/s per call, physical-to-logical sequence ratio, losing-branch lifetime and
   cancelled tokens, peak KV blocks, lazy-verification flush reasons. The generator and the verifier
   backends are wrapped (same protocols, every call timed), so each generator iteration's time is fitted as
   `fixed + per_row * rows` and each PRM call's as `fixed + per_token * tokens`; the time spent sizing
   queued steps for the PRM (`tokens_to_compute`, part of "other") is measured separately, and the
   sequences the generator holds at each iteration are counted (`live_sequences_mean`: with the mean rows,
   what `specscale_lab/calibration/cpu_fit.py` splits the host time by).
3. From the `beam` runs (every candidate finishes and is scored once): the common-prefix token ratio
   of each sibling group (1 - token-trie nodes / tokens: what computation deduplication could save)
   and the histogram of PRM step scores, with the fraction exactly 1.0 (what the perfect-score
   shortcut can use).
4. A cProfile of one `--profile-variant` run: self time grouped by package, and the top functions.
Scalars are medians over repeats; distributions pool the repeats.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from specscale_lab.bench.arguments import LADDER, add_common_arguments, search_settings
from specscale_lab.bench.numbers import median_summary, percentile, serving_numbers
from specscale_lab.bench.outputs import finish_info, markdown_table, new_figure, write_outputs
from specscale_lab.bench.profiling import profile_report, profile_run
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run
from specscale_lab.bench.timed_backends import TimedGenerator, TimedVerifier

NAME = "characterize"
FULL = {"problems": 32, "repeats": 3, "beam_sizes": [8], "max_rounds": 40, "variants": list(LADDER),
        "waiting_problems": 24}
QUICK = {"problems": 6, "repeats": 1, "beam_sizes": [4], "max_rounds": 8,
         "variants": ["beam", "naive-spec", "fasttts", "specscale"], "waiting_problems": 3}
SCORE_BINS = 20


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="waiting, prefix sharing, PRM scores, time split, batching, lifetimes")
    add_common_arguments(parser)
    parser.add_argument("--waiting-problems", type=int, default=None, help="problems of the batch-size-1 run")
    parser.add_argument("--profile-variant", default="specscale", help="variant of the cProfile run ('' for none)")
    parser.set_defaults(func=run)


def run(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    problems = testbed.problems(args.problems)
    waiting = waiting_at_batch_size_one(testbed, args)
    runs, searches = measure(testbed, args, problems)
    tokenizer = testbed.stack.tokenizer
    beam_searches = [s for (variant, _), found in searches.items() if variant == "beam" for s in found]
    extra = {
        "waiting_batch_size_1": waiting,
        "common_prefix": common_prefix(beam_searches, tokenizer),
        "prm_scores": score_histogram(beam_searches),
        "profile": profile_run(testbed, args, problems) if args.profile_variant else None,
    }
    testbed.close()
    results = summarize(runs)
    info = finish_info(info, started)
    text = report(results, extra)
    write_outputs(args.out, NAME, info, strip_samples(runs), results, text, plot(results, runs, extra), extra)
    print(text)
    return 0


# ---- 1. waiting at batch size 1 ---------------------------------------------------------------------
def waiting_at_batch_size_one(testbed, args) -> dict:
    problems = testbed.problems(args.waiting_problems)
    n = max(args.beam_sizes)
    requests = search_requests(testbed, problems, "beam", args.seed, tag="batch-1 ",
                               **search_settings(args, n))
    with progress_bar(len(requests), "waiting at batch size 1") as bar:
        batch = run_batch(fresh_runtime(testbed, 1), requests, bar)
    per_request = []
    for problem, request in zip(problems, requests, strict=True):
        rounds = batch.runtime.search(request.request_id).round_waiting
        idle, busy = sum(i for i, _ in rounds), sum(b for _, b in rounds)
        per_request.append({"events": testbed.difficulty(problem), "ratio": idle / (idle + busy) if idle + busy else 0.0})
    by_events = defaultdict(list)
    for entry in per_request:
        by_events[entry["events"]].append(entry["ratio"])
    return {
        "beam_size": n,
        "difficulty": testbed.difficulty_unit,
        "overall": batch.runtime.metrics.summary()["waiting_time_ratio"],
        "median_per_request": statistics.median(e["ratio"] for e in per_request),
        "by_events": {str(k): statistics.median(v) for k, v in sorted(by_events.items())},
        "requests": per_request,
    }


# ---- 2. the ladder under load -------------------------------------------------------------------------
def measure(testbed, args, problems) -> tuple[list[dict], dict]:
    """Every (variant, beam size) per repeat, interleaved; the searches of repeat 0 are kept."""
    cells = [(v, n) for n in args.beam_sizes for v in args.variants]
    runs, searches = [], {}
    with progress_bar(len(cells) * args.repeats * len(problems), NAME) as bar:
        for repeat, (variant, n) in interleaved(cells, args.repeats):
            bar.set_postfix_str(f"repeat {repeat} {variant} N={n}")
            generator, verifier = testbed.backends()
            generator, verifier = TimedGenerator(generator, testbed.clock), TimedVerifier(verifier, testbed.clock)
            runtime = fresh_runtime(testbed, args.max_concurrency, generator=generator, verifier=verifier)
            requests = search_requests(testbed, problems, variant, args.seed, **search_settings(args, n))
            batch = run_batch(runtime, requests, bar)
            runs.append({"variant": variant, "beam_size": n, "repeat": repeat,
                         **characterization(batch, problems, generator, verifier)})
            if repeat == 0:
                searches[(variant, n)] = [runtime.search(r.request_id) for r in requests]
    return runs, searches


def characterization(batch, problems, engine: TimedGenerator, verifier: TimedVerifier) -> dict:
    metrics = batch.runtime.metrics
    numbers = serving_numbers(batch, problems)
    iteration_fixed, iteration_per_row = linear_fit(engine.iterations)
    call_fixed, call_per_token = linear_fit([(tokens, s) for _, tokens, s in verifier.calls])
    prm_tokens = sum(tokens for _, tokens, _ in verifier.calls)
    prm_seconds = sum(s for _, _, s in verifier.calls)
    return {
        **numbers,
        "generation_share": numbers["generation_s"] / batch.elapsed_s,
        "verification_share": numbers["verification_s"] / batch.elapsed_s,
        "other_share": numbers["other_s"] / batch.elapsed_s,
        "sizing_s": verifier.sizing_s,
        "iterations": len(engine.iterations),
        "iteration_ms_mean": 1000 * numbers["generation_s"] / max(len(engine.iterations), 1),
        "iteration_fixed_ms": 1000 * iteration_fixed,
        "iteration_per_row_ms": 1000 * iteration_per_row,
        "rows_per_iteration_mean": statistics.fmean(r for r, _ in engine.iterations) if engine.iterations else 0.0,
        "live_sequences_mean": statistics.fmean(engine.live_sequences) if engine.live_sequences else 0.0,
        "iteration_fixed_share": len(engine.iterations) * iteration_fixed / numbers["generation_s"]
        if numbers["generation_s"] else 0.0,
        "prm_call_fixed_ms": 1000 * call_fixed,
        "prm_call_per_token_ms": 1000 * call_per_token,
        "prm_call_fixed_share": len(verifier.calls) * call_fixed / prm_seconds if prm_seconds else 0.0,
        "prm_tokens_per_s": prm_tokens / prm_seconds if prm_seconds else 0.0,
        "verifier_batch_items_p90": percentile(metrics.verifier_batch_items, 90),
        "verifier_batch_tokens_p90": percentile(metrics.verifier_batch_tokens, 90),
        "cancelled_sequences": len(metrics.cancelled_tokens),
        "cancelled_tokens": sum(metrics.cancelled_tokens),
        "losing_lifetime_median_s": percentile(metrics.cancelled_lifetimes_s, 50),
        "losing_lifetime_p90_s": percentile(metrics.cancelled_lifetimes_s, 90),
        "waiting_time_ratio": metrics.summary()["waiting_time_ratio"],
        "flush_reasons": batch.runtime.flush_reasons,
        "samples": {
            "verifier_batch_items": list(metrics.verifier_batch_items),
            "verifier_batch_tokens": list(metrics.verifier_batch_tokens),
            "cancelled_lifetimes_s": list(metrics.cancelled_lifetimes_s),
            "iterations": engine.iterations,
            "prm_calls": verifier.calls,
        },
    }


def linear_fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of seconds against size: least squares over the median time of each size,
    weighted by how often the size occurs (so a few slow prefill iterations do not tilt the line);
    (median, 0) if the size never varies."""
    by_size: dict[float, list[float]] = defaultdict(list)
    for size, seconds in points:
        by_size[size].append(seconds)
    if not by_size:
        return 0.0, 0.0
    if len(by_size) == 1:
        return statistics.median(next(iter(by_size.values()))), 0.0
    sizes = np.array(list(by_size), dtype=float)
    medians = np.array([statistics.median(v) for v in by_size.values()])
    weights = np.sqrt([len(v) for v in by_size.values()])
    slope, intercept = np.polyfit(sizes, medians, 1, w=weights)
    return float(intercept), float(slope)


def summarize(runs: list[dict]) -> dict:
    results: dict = {}
    for variant, n in dict.fromkeys((r["variant"], r["beam_size"]) for r in runs):
        mine = [r for r in runs if r["variant"] == variant and r["beam_size"] == n]
        cell = median_summary([{k: v for k, v in r.items() if k != "repeat"} for r in mine])
        cell["flush_reasons"] = pooled_counts(r["flush_reasons"] for r in mine)
        results.setdefault(variant, {})[str(n)] = cell
    return results


def pooled_counts(dicts) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for counts in dicts:
        for key, value in counts.items():
            total[key] += value
    return dict(total)


def strip_samples(runs: list[dict]) -> list[dict]:
    """raw.json keeps the per-call samples except the per-iteration pairs (large, summarized by the fit)."""
    return [dict(r, samples={k: v for k, v in r["samples"].items() if k != "iterations"}) for r in runs]


# ---- 3. what the beam runs show ------------------------------------------------------------------------
def sibling_groups(search) -> list[list]:
    """Candidates of one round with the same parent (round 0: children of the prompt), two or more."""
    groups: dict = defaultdict(list)
    for rd in search.rounds:
        for candidate in rd.candidates:
            groups[(rd.index, id(candidate.parent))].append(candidate)
    return [group for group in groups.values() if len(group) > 1]


def shared_tokens(token_lists: list[list[int]]) -> tuple[int, int]:
    """(tokens a token trie of the group saves, tokens in the group)."""
    nodes = {tuple(tokens[: i + 1]) for tokens in token_lists for i in range(len(tokens))}
    total = sum(len(tokens) for tokens in token_lists)
    return total - len(nodes), total


def common_prefix(searches: list, tokenizer) -> dict:
    """Share of generated tokens a sibling group has in common (re-tokenized from the step texts)."""
    saved = total = 0
    per_group: list[float] = []
    by_round: defaultdict[int, list[int]] = defaultdict(lambda: [0, 0])
    for search in searches:
        for group in sibling_groups(search):
            group_saved, group_total = shared_tokens([tokenizer.encode(c.text) for c in group])
            saved, total = saved + group_saved, total + group_total
            by_round[group[0].round][0] += group_saved
            by_round[group[0].round][1] += group_total
            if group_total:
                per_group.append(group_saved / group_total)
    return {
        "token_weighted": saved / total if total else 0.0,
        "median_per_group": statistics.median(per_group) if per_group else 0.0,
        "groups": len(per_group),
        "by_round": {str(r): s / t for r, (s, t) in sorted(by_round.items()) if t},
        "per_group": per_group,
    }


def score_histogram(searches: list) -> dict:
    """The PRM score of every scored candidate's newest step."""
    scores = [c.step_scores[-1] for search in searches for c in search.candidates.values() if c.step_scores]
    counts, edges = np.histogram(scores, bins=SCORE_BINS, range=(0.0, 1.0))
    return {
        "scores": len(scores),
        "fraction_exactly_1": sum(s == 1.0 for s in scores) / len(scores) if scores else 0.0,
        "fraction_above_0.99": sum(s >= 0.99 for s in scores) / len(scores) if scores else 0.0,
        "median": statistics.median(scores) if scores else 0.0,
        "bin_edges": edges.tolist(),
        "counts": counts.tolist(),
    }


# ---- report ------------------------------------------------------------------------------------------------
def report(results: dict, extra: dict) -> str:
    rows = []
    for variant, by_size in results.items():
        for n, c in by_size.items():
            rows.append([variant, int(n), 100 * c["generation_share"], 100 * c["verification_share"],
                         100 * c["other_share"], c["sizing_s"], c["verifier_calls"], c["verifier_batch_items_median"],
                         c["verifier_batch_tokens_median"], c["verifier_batch_requests_mean"], c["prm_tokens_per_s"],
                         c["physical_to_logical"],
                         c["losing_lifetime_median_s"], c["cancelled_tokens"], c["peak_kv_blocks"]])
    header = ["variant", "N", "gen %", "PRM %", "other %", "sizing s", "PRM calls", "paths/call", "tokens/call",
              "req/call", "PRM tok/s", "phys/log", "losing life s", "cancelled tok", "peak KV"]
    text = "\n## Under load: time split, verifier batching, sequences, cancellations\n\n" + markdown_table(header, rows)
    rows = [[variant, int(n), c["iterations"], c["rows_per_iteration_mean"], c["iteration_ms_mean"],
             c["iteration_fixed_ms"], c["iteration_per_row_ms"], 100 * c["iteration_fixed_share"],
             c["prm_call_fixed_ms"], c["prm_call_per_token_ms"], 100 * c["prm_call_fixed_share"],
             ", ".join(f"{k} {v}" for k, v in c["flush_reasons"].items()) or None]
            for variant, by_size in results.items() for n, c in by_size.items()]
    header = ["variant", "N", "gen iterations", "rows/iter", "ms/iter", "fixed ms", "ms/row", "fixed % of gen",
              "PRM fixed ms", "PRM ms/token", "fixed % of PRM", "PRM flush reasons"]
    text += "\n## Cost model (least-squares fits over every call)\n\n" + markdown_table(header, rows)
    text += waiting_report(extra["waiting_batch_size_1"]) + sharing_report(extra)
    if extra["profile"]:
        text += profile_report(extra["profile"])
    return text


def waiting_report(waiting: dict) -> str:
    rows = [[f"{waiting['difficulty']} {k}", ratio] for k, ratio in waiting["by_events"].items()]
    return (f"\n## Waiting at batch size 1 (beam, N = {waiting['beam_size']})\n\n"
            f"Share of candidate time spent finished and waiting for the round: {100 * waiting['overall']:.1f}% "
            f"overall, median per request {100 * waiting['median_per_request']:.1f}%.\n\n"
            + markdown_table(["difficulty", "median waiting ratio"], rows))


def sharing_report(extra: dict) -> str:
    prefix, scores = extra["common_prefix"], extra["prm_scores"]
    rounds = ", ".join(f"round {r}: {100 * v:.0f}%" for r, v in prefix["by_round"].items())
    return (f"\n## Prefix sharing and PRM scores (beam runs)\n\n"
            f"Common-prefix token ratio over {prefix['groups']} sibling groups: {100 * prefix['token_weighted']:.1f}% "
            f"of their tokens (median group {100 * prefix['median_per_group']:.1f}%); {rounds}.\n\n"
            f"PRM step scores: {scores['scores']} scored, median {scores['median']:.3f}, "
            f"{100 * scores['fraction_exactly_1']:.1f}% exactly 1.0, "
            f"{100 * scores['fraction_above_0.99']:.1f}% ≥ 0.99.\n")


def plot(results: dict, runs: list[dict], extra: dict):
    figure, axes = new_figure(2, 4, width=4.6, height=3.6)
    split, batches, prm_speed, scores, prefix, waiting, iterations, spare = axes
    first = [r for r in runs if r["repeat"] == 0]
    plot_time_split(split, results)
    plot_prm_batches(batches, prm_speed, first)
    plot_distributions(scores, prefix, waiting, extra)
    plot_iterations(iterations, [r for r in first if r["variant"] in ("beam", "specscale")])
    spare.set_axis_off()
    return figure


def plot_time_split(axis, results: dict) -> None:
    labels = [f"{v} {n}" for v, by_size in results.items() for n in by_size]
    cells = [c for by_size in results.values() for c in by_size.values()]
    bottom = [0.0] * len(cells)
    for part in ("generation_share", "verification_share", "other_share"):
        axis.bar(labels, [c[part] for c in cells], bottom=bottom, label=part.removesuffix("_share"))
        bottom = [b + c[part] for b, c in zip(bottom, cells, strict=True)]
    axis.set_title("time split under load")
    axis.tick_params(axis="x", rotation=60, labelsize=7)
    axis.legend(fontsize=7)


def plot_prm_batches(sizes, speed, runs: list[dict]) -> None:
    """CDF of PRM tokens per call, and each call's PRM tokens/s against its size."""
    for run in runs:
        label = f"{run['variant']} {run['beam_size']}"
        tokens = sorted(run["samples"]["verifier_batch_tokens"])
        if tokens:
            sizes.plot(tokens, np.linspace(0, 1, len(tokens)), label=label)
        calls = [(t, t / seconds) for _, t, seconds in run["samples"]["prm_calls"] if t]
        speed.scatter([t for t, _ in calls], [v for _, v in calls], s=4, label=label)
    sizes.set_xscale("symlog")
    sizes.set_title("PRM tokens per verifier call (CDF)")
    speed.set_xscale("log")
    speed.set_xlabel("PRM tokens in the call")
    speed.set_ylabel("PRM tokens / s")
    for axis in (sizes, speed):
        axis.legend(fontsize=6)


def plot_distributions(scores, prefix, waiting, extra: dict) -> None:
    histogram = extra["prm_scores"]
    scores.bar(histogram["bin_edges"][:-1], histogram["counts"], width=1 / SCORE_BINS, align="edge")
    scores.set_title(f"PRM step scores (beam); {100 * histogram['fraction_exactly_1']:.1f}% exactly 1.0")
    prefix.hist(extra["common_prefix"]["per_group"], bins=20, range=(0, 1))
    prefix.set_title("common-prefix token ratio per sibling group")
    by_events = extra["waiting_batch_size_1"]["by_events"]
    waiting.bar(list(by_events), list(by_events.values()))
    waiting.set_title(f"waiting ratio at batch size 1 by {extra['waiting_batch_size_1']['difficulty']}")


def plot_iterations(axis, runs: list[dict]) -> None:
    for run in runs:
        points = run["samples"]["iterations"]
        axis.scatter([rows for rows, _ in points], [1000 * s for _, s in points], s=4,
                     label=f"{run['variant']} {run['beam_size']}")
    axis.set_xlabel("sequences advanced")
    axis.set_yscale("log")
    axis.set_ylabel("ms per generator iteration (log)")
    axis.legend(fontsize=7)
