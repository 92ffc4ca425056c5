"""`specscale bench latency`: open-loop arrivals at a sweep of rates (docs/BENCHMARKS.md).

Requests arrive with gamma-distributed gaps of mean 1 / rate; the shape is the burstiness knob
(1.0 = a Poisson process, below 1 burstier, above 1 more regular), as `vllm bench serve` does. The
runtime is driven directly: a request is submitted once its arrival time has passed, and the runtime
ticks in between (sleeping only when it has nothing to do). Latency is measured from the arrival time,
not from the submission, so a tick that delays a submission counts against the system.

Per (variant, beam size, rate): mean normalized latency (end-to-end / output tokens of the request, in
ms per token) and raw end-to-end p50 / p90 / p99, medians over repeats. Every variant sees the same
arrival times and paired seeds within a repeat; cells are interleaved. Without `--rates`, the rates
are fractions of a measured capacity: the requests/s of the first variant serving all problems at
once (closed loop). The sustainable rate of a variant is the highest swept rate at which it, and every
lower rate, stays under the normalized-latency budget (`--budget-ms-per-token`, or by default
`--budget-factor` times the first variant's normalized latency at the lowest rate) *and keeps up with the
arrivals*: requests wait for admission (all `--max-concurrency` slots busy) on average no longer than
`--max-queued-share` (0.1) of the median latency. A run of a few hundred requests past the server's capacity
only queues them: their latency per token can stay under the budget while the queue grows without bound,
so the budget alone would call a saturated server sustained.
"""

from __future__ import annotations

import statistics
from collections import deque

import numpy as np

from specscale.runtime.runtime import SearchRuntime
from specscale_lab.bench.arguments import add_common_arguments, float_list, search_settings
from specscale_lab.bench.numbers import median_summary, percentile, prm_numbers
from specscale_lab.bench.outputs import finish_info, flush_text, markdown_table, new_figure, write_outputs
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run

NAME = "latency"
BUDGET_KEYS = {"output": "mean_normalized_ms_per_token", "answer": "mean_normalized_ms_per_answer_token"}
MAX_QUEUED_SHARE = 0.1  # keeping up: the mean admission wait is at most this share of the median latency
FULL = {"problems": 48, "repeats": 3, "beam_sizes": [8], "max_rounds": 40,
        "variants": ["beam", "naive-spec", "fasttts", "ep+cd", "specscale"],
        "rate_fractions": [0.25, 0.5, 1.0, 1.5, 2.0]}
QUICK = {"problems": 6, "repeats": 2, "beam_sizes": [4], "max_rounds": 8,
         "variants": ["beam", "specscale"], "rate_fractions": [0.5, 1.5]}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="normalized and end-to-end latency under open-loop arrivals")
    add_common_arguments(parser)
    parser.add_argument("--rates", type=float_list, default=None, help="arrival rates in requests/s")
    parser.add_argument("--rate-fractions", type=float_list, default=None,
                        help="without --rates: rates as fractions of the measured capacity")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps (1.0 = Poisson)")
    parser.add_argument("--budget-ms-per-token", type=float, default=None, help="normalized-latency budget")
    parser.add_argument("--budget-factor", type=float, default=2.0,
                        help="without a budget: this times the first variant's latency at the lowest rate")
    parser.add_argument("--budget-unit", choices=sorted(BUDGET_KEYS), default="output",
                        help="the tokens the budget is per: every returned path's (output) or the selected answer's")
    parser.add_argument("--max-queued-share", type=float, default=MAX_QUEUED_SHARE,
                        help="a rate is sustained only if requests wait for admission at most this share of the "
                             "median latency on average (the server keeps up)")
    parser.set_defaults(func=run)


def run(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    problems = testbed.problems(args.problems)
    rates, capacity = sweep_rates(testbed, args, problems)
    cells = [(variant, n, rate) for rate in rates for n in args.beam_sizes for variant in args.variants]
    runs = measure(testbed, args, problems, cells, rates)
    testbed.close()
    results = summarize(runs, cells)
    budget = budget_ms_per_token(args, results, rates)
    for by_size in results.values():
        for cell in by_size.values():
            cell["max_sustainable_rate"] = sustainable_rate(cell["rates"], budget, BUDGET_KEYS[args.budget_unit],
                                                            args.max_queued_share)
    extra = {"rates": rates, "capacity_requests_per_s": capacity, "burstiness": args.burstiness,
             "budget_ms_per_token": budget, "budget_unit": args.budget_unit, "max_queued_share": args.max_queued_share}
    info = finish_info(info, started)
    text = report(results, budget, capacity, args.budget_unit, args.max_queued_share)
    write_outputs(args.out, NAME, info, runs, results, text, plot(results, budget, args.budget_unit), extra)
    print(text)
    return 0


def sweep_rates(testbed, args, problems) -> tuple[list[float], float | None]:
    """The rates to sweep: given, or fractions of the first variant's closed-loop requests/s."""
    if args.rates:
        return sorted(args.rates), None
    requests = search_requests(testbed, problems, args.variants[0], args.seed, tag="capacity ",
                               **search_settings(args, max(args.beam_sizes)))
    batch = run_batch(fresh_runtime(testbed, args.max_concurrency), requests)
    capacity = len(problems) / batch.elapsed_s
    return [capacity * f for f in sorted(args.rate_fractions)], capacity


def arrival_times(count: int, rate: float, burstiness: float, seed: list[int]) -> list[float]:
    """Seconds from the start: the first request at 0, gamma gaps of mean 1 / rate after it."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count - 1)
    return [0.0] + np.cumsum(gaps).tolist()


def measure(testbed, args, problems, cells, rates) -> list[dict]:
    runs = []
    with progress_bar(len(cells) * args.repeats * len(problems), NAME) as bar:
        for repeat, (variant, n, rate) in interleaved(cells, args.repeats):
            bar.set_postfix_str(f"repeat {repeat} {variant} N={n} {rate:.2f} req/s")
            arrivals = arrival_times(len(problems), rate, args.burstiness, [args.seed, repeat, rates.index(rate)])
            requests = search_requests(testbed, problems, variant, args.seed, **search_settings(args, n))
            latencies, runtime = serve_open_loop(testbed, args.max_concurrency, requests, arrivals, bar)
            runs.append({"variant": variant, "beam_size": n, "rate": rate, "repeat": repeat,
                         **latency_numbers(latencies), **prm_numbers(runtime), "requests": latencies})
    return runs


def serve_open_loop(testbed, max_concurrency: int, requests, arrivals: list[float], bar) -> tuple[list[dict], SearchRuntime]:
    """Submit each request at its arrival time, tick the runtime in between; per-request latencies and the
    runtime. Time is the testbed's clock: with nothing to do, a real testbed sleeps and a simulated one
    advances its clock."""
    clock = testbed.clock
    finished_at: dict[str, float] = {}
    runtime = fresh_runtime(testbed, max_concurrency,
                            on_finished=lambda request_id, _: finished_at.__setitem__(request_id, clock()))
    pending = deque(zip(arrivals, requests, strict=True))
    ids = []
    start = clock()
    while pending or runtime.has_work():
        while pending and start + pending[0][0] <= clock():  # absolute times: no rounding between the two sides
            ids.append(runtime.submit(pending.popleft()[1]))
        if runtime.has_work():
            bar.update(len(runtime.step()))
        elif pending:
            testbed.wait_until(start + pending[0][0])
    out = []
    for request_id, arrival in zip(ids, arrivals, strict=True):
        result = runtime.result(request_id)
        latency = finished_at[request_id] - (start + arrival)
        out.append({"arrival_s": arrival, "latency_s": latency, "output_tokens": result.usage.output_tokens,
                    "answer_tokens": result.best.num_tokens if result.best is not None else 0,
                    "queued_s": result.timings.queued_s})
    return out, runtime


def latency_numbers(requests: list[dict]) -> dict[str, float]:
    latencies = [r["latency_s"] for r in requests]
    normalized = [r["latency_s"] / r["output_tokens"] for r in requests if r["output_tokens"]]
    per_answer = [r["latency_s"] / r["answer_tokens"] for r in requests if r.get("answer_tokens")]
    return {
        "mean_normalized_ms_per_token": 1000 * statistics.fmean(normalized) if normalized else float("inf"),
        "mean_normalized_ms_per_answer_token": 1000 * statistics.fmean(per_answer) if per_answer else float("inf"),
        "p50_s": percentile(latencies, 50),
        "p90_s": percentile(latencies, 90),
        "p99_s": percentile(latencies, 99),
        "mean_queued_s": statistics.fmean(r["queued_s"] for r in requests),
    }


def summarize(runs: list[dict], cells) -> dict:
    """results[variant][beam size]["rates"]: one entry per rate, medians over repeats."""
    results: dict = {}
    for variant, n, rate in cells:
        mine = [{k: v for k, v in r.items() if k not in ("requests", "repeat")}
                for r in runs if (r["variant"], r["beam_size"], r["rate"]) == (variant, n, rate)]
        results.setdefault(variant, {}).setdefault(str(n), {"rates": []})["rates"].append(median_summary(mine))
    return results


def budget_ms_per_token(args, results: dict, rates: list[float]) -> float:
    if args.budget_ms_per_token is not None:
        return args.budget_ms_per_token
    reference = results[args.variants[0]][str(min(args.beam_sizes))]["rates"]
    lowest = next(point for point in reference if point["rate"] == rates[0])
    return args.budget_factor * lowest[BUDGET_KEYS[args.budget_unit]]


def sustainable_rate(points: list[dict], budget: float, key: str = BUDGET_KEYS["output"],
                     max_queued_share: float = MAX_QUEUED_SHARE) -> float | None:
    """The highest rate at which this and every lower rate meet the budget (on `key`) and keep up with the
    arrivals (`keeps_up`); None if the lowest fails."""
    best = None
    for point in sorted(points, key=lambda p: p["rate"]):
        if point[key] > budget or not keeps_up(point, max_queued_share):
            break
        best = point["rate"]
    return best


def keeps_up(point: dict, max_queued_share: float) -> bool:
    """Requests waited for admission on average at most this share of the median latency."""
    return point["mean_queued_s"] <= max_queued_share * point["p50_s"]


def report(results: dict, budget: float, capacity: float | None, unit: str = "output",
           max_queued_share: float = MAX_QUEUED_SHARE) -> str:
    rows = []
    for variant, by_size in results.items():
        for n, cell in by_size.items():
            for point in cell["rates"]:
                rows.append([variant, int(n), point["rate"], point["mean_normalized_ms_per_token"],
                             point["mean_normalized_ms_per_answer_token"], point["p50_s"],
                             point["p90_s"], point["p99_s"], point["mean_queued_s"], point["verifier_calls"],
                             point["verifier_batch_tokens_median"], point["verifier_batch_requests_mean"],
                             flush_text(point.get("flush_reasons"))])
    header = ["variant", "N", "rate req/s", "norm. ms/token", "ms/answer token", "p50 s", "p90 s", "p99 s", "queued s", "PRM calls",
              "PRM tok/call", "req/call", "lazy flushes"]
    text = "\n## Latency against arrival rate (medians over repeats)\n\n" + markdown_table(header, rows)
    calibration = "" if capacity is None else f"; rates are fractions of a measured capacity of {capacity:.2f} req/s"
    text += (f"\n## Highest rate under {budget:.1f} ms per {unit} token, keeping up with the arrivals (mean admission "
             f"wait at most {max_queued_share:.0%} of the median latency){calibration}\n\n")
    sustained = [[variant, int(n), cell["max_sustainable_rate"]] for variant, by_size in results.items()
                 for n, cell in by_size.items()]
    return text + markdown_table(["variant", "N", "max sustainable req/s"], sustained)


def plot(results: dict, budget: float, unit: str = "output"):
    figure, (normalized, raw) = new_figure(1, 2)
    for variant, by_size in results.items():
        for n, cell in by_size.items():
            points = sorted(cell["rates"], key=lambda p: p["rate"])
            rates = [p["rate"] for p in points]
            line, = normalized.plot(rates, [p[BUDGET_KEYS[unit]] for p in points], "o-",
                                    label=f"{variant} N={n}")
            raw.plot(rates, [p["p90_s"] for p in points], "o-", color=line.get_color(), label=f"{variant} N={n} p90")
            raw.plot(rates, [p["p50_s"] for p in points], "--", color=line.get_color())
    normalized.axhline(budget, color="grey", linestyle=":", label="budget")
    normalized.set_xlabel("arrival rate (requests / s)")
    normalized.set_ylabel(f"mean normalized latency (ms / {unit} token)")
    normalized.legend(fontsize=8)
    raw.set_xlabel("arrival rate (requests / s)")
    raw.set_ylabel("end-to-end latency (s): p90 solid, p50 dashed")
    raw.legend(fontsize=8)
    return figure
