"""A run's numbers: throughput, accuracy and PRM batching of one batch (`serving_numbers`, `prm_numbers`), a
search's answer judged against the truth (`is_right`, `vote_is_right`) and the reductions over repeats
(`median_summary`, `percentile`)."""

from __future__ import annotations

import statistics
from typing import Any

from specscale.runtime.runtime import SearchRuntime
from specscale.search.result import SearchResult
from specscale_lab.bench.runs import BatchRun
from specscale_lab.tasks.toy import ToyProblem, is_correct


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


def other_seconds(elapsed: float, generation: float, verification: float) -> float:
    """Wall (or simulated) time spent neither generating nor verifying. On the virtual clock the elapsed
    time is exactly the sum of the two, so what is left is float rounding (~1e-14 s): reported as 0."""
    other = elapsed - generation - verification
    return other if other > 1e-9 * max(elapsed, 1.0) else 0.0


def median_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric, the median over repeats (metrics every run has); flush reasons, counted per repeat, too."""
    keys = [k for k in runs[0] if all(isinstance(r.get(k), (int, float)) for r in runs)]
    summary = {k: statistics.median(r[k] for r in runs) for k in keys}
    if all(isinstance(r.get("flush_reasons"), dict) for r in runs):
        reasons = sorted({k for r in runs for k in r["flush_reasons"]})
        summary["flush_reasons"] = {k: statistics.median(r["flush_reasons"].get(k, 0) for r in runs) for k in reasons}
    return summary


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linearly interpolated; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
