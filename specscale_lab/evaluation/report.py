"""The final table of `specscale eval`: accuracy per preset with 95% CIs, paired differences, tokens/s.

Accuracy is computed three ways per preset (the best path's answer, the PRM-weighted vote, the plain
majority vote), over the run's problems and seeds, as `specscale bench accuracy` does: the problem is
the unit (its seeds averaged first), mean ± 1.96 standard errors. Every other preset is compared with
the first one listed on the same problems and seeds (a paired difference), so the CI of a difference
is far narrower than the two accuracies' CIs suggest. Tokens/s is output tokens (the returned paths')
over the wall time of the completed batches.
"""

from __future__ import annotations

import statistics

from specscale.grading import Problem
from specscale_lab.bench.accuracy import accuracy_ci, paired_difference
from specscale_lab.bench.outputs import markdown_table

ANSWERS = ("best", "weighted_vote", "majority_vote")


def summarize(records: list[dict], batches: list[dict], problems: list[Problem], presets: list[str],
              seeds: list[int]) -> dict:
    """Per preset: accuracy with CIs, the paired difference to the first preset, tokens and speed."""
    by_key = {(r["preset"], r["seed"], r["problem_id"]): r for r in records}
    outcomes = {preset: {answer: {seed: [int(by_key[preset, seed, p.problem_id]["correct"][answer]) for p in problems]
                                  for seed in seeds} for answer in ANSWERS} for preset in presets}
    reference = presets[0]
    summary = {}
    for preset in presets:
        chosen = [by_key[preset, seed, p.problem_id] for seed in seeds for p in problems]
        cell = {"searches": len(chosen), "accuracy": {a: accuracy_ci(outcomes[preset][a]) for a in ANSWERS},
                **usage_numbers(chosen, [b for b in batches if b["preset"] == preset and b["seed"] in seeds])}
        if preset != reference:
            cell["difference_to_" + reference] = {a: paired_difference(outcomes[preset][a], outcomes[reference][a])
                                                  for a in ANSWERS}
        summary[preset] = cell
    return summary


def usage_numbers(records: list[dict], batches: list[dict]) -> dict:
    """Tokens per search, latency, errors, and tokens/s over the completed batches."""
    elapsed = sum(b["elapsed_s"] for b in batches)
    return {
        "output_tokens_per_search": statistics.fmean(r["tokens"]["output_tokens"] for r in records),
        "generated_tokens_per_search": statistics.fmean(r["tokens"]["generated_tokens"] for r in records),
        "latency_s_mean": statistics.fmean(r["timings"]["total_s"] for r in records),
        "errors": sum(r["error"] is not None for r in records),
        "unanswered": sum(r["answer"] is None for r in records),
        "output_tokens_per_s": sum(b["output_tokens"] for b in batches) / elapsed if elapsed else None,
        "generated_tokens_per_s": sum(b["generated_tokens"] for b in batches) / elapsed if elapsed else None,
    }


def markdown(summary: dict, reference: str) -> str:
    header = ["preset", "searches", "best %", "95% CI", "weighted vote %", "majority %",
              f"Δ best vs {reference} (pp)", "95% CI (pp)", "output tok/s", "tokens / search", "no answer"]
    rows = []
    for preset, cell in summary.items():
        accuracy = cell["accuracy"]
        difference = cell.get("difference_to_" + reference, {}).get("best")
        rows.append([preset, cell["searches"], 100 * accuracy["best"]["mean"], interval(accuracy["best"]),
                     100 * accuracy["weighted_vote"]["mean"], 100 * accuracy["majority_vote"]["mean"],
                     None if difference is None else f"{100 * difference['mean']:+.1f}",
                     None if difference is None else interval(difference, signed=True),
                     cell["output_tokens_per_s"], cell["output_tokens_per_search"], cell["unanswered"]])
    return markdown_table(header, rows)


def interval(ci: dict, signed: bool = False) -> str:
    """A CI in percent (points for a difference, signed); an accuracy's clipped to [0, 100]."""
    if signed:
        return f"[{100 * ci['ci95_low']:+.1f}, {100 * ci['ci95_high']:+.1f}]"
    return f"[{max(0.0, 100 * ci['ci95_low']):.1f}, {min(100.0, 100 * ci['ci95_high']):.1f}]"
