"""`specscale bench scaling`: beam size and concurrency against throughput and KV (issue 6 item 5).

Two sweeps per variant, all requests issued at once: the beam size N over `--beam-sizes` at
`--max-concurrency` requests in flight, and the concurrency over `--concurrencies` at N =
`--concurrency-beam-size`. A run serves `--waves` times its concurrency in requests, so every point
keeps its slots full for the same number of waves. Per point (medians over repeats, points
interleaved within each repeat): output tokens/s, requests/s, the time split, the physical-to-logical
ratio and the peak KV blocks in use (and their share of the pool).
"""

from __future__ import annotations

from specscale_lab.bench.arguments import add_common_arguments, int_list, search_settings
from specscale_lab.bench.numbers import median_summary, serving_numbers
from specscale_lab.bench.outputs import finish_info, markdown_table, new_figure, write_outputs
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run

NAME = "scaling"
FULL = {"repeats": 3, "beam_sizes": [4, 8, 16, 32], "max_rounds": 40, "variants": ["beam", "specscale"],
        "concurrencies": [16, 32, 64, 128], "concurrency_beam_size": 8, "waves": 2}
QUICK = {"repeats": 2, "beam_sizes": [4, 8], "max_rounds": 8, "variants": ["beam", "specscale"],
         "concurrencies": [2, 4], "concurrency_beam_size": 4, "waves": 1, "max_concurrency": 4}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="throughput and peak KV against beam size and concurrency")
    add_common_arguments(parser, problems=False)
    parser.add_argument("--concurrencies", type=int_list, default=None, help="requests in flight to sweep")
    parser.add_argument("--concurrency-beam-size", type=int, default=None, help="N of the concurrency sweep")
    parser.add_argument("--waves", type=int, default=None, help="requests per run = waves x concurrency")
    parser.set_defaults(func=run)


def run(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK)
    cells = sweep_cells(args)
    runs = measure(testbed, args, cells)
    total_blocks = testbed.stack.generator_kv_blocks()
    testbed.close()
    results = summarize(runs, cells, total_blocks)
    info = finish_info(info, started)
    text = report(results)
    write_outputs(args.out, NAME, info, runs, results, text, plot(results, args), {"kv_blocks_total": total_blocks})
    print(text)
    return 0


def sweep_cells(args) -> list[tuple[str, int, int]]:
    """(variant, beam size, concurrency): the N sweep, then the concurrency sweep, shared points once."""
    points = [(n, args.max_concurrency) for n in args.beam_sizes]
    points += [(args.concurrency_beam_size, c) for c in args.concurrencies]
    return [(variant, n, c) for n, c in dict.fromkeys(points) for variant in args.variants]


def measure(testbed, args, cells) -> list[dict]:
    problems = testbed.problems(args.waves * max(c for _, _, c in cells))
    total = sum(args.waves * c for _, _, c in cells) * args.repeats
    runs = []
    with progress_bar(total, NAME) as bar:
        for repeat, (variant, n, concurrency) in interleaved(cells, args.repeats):
            bar.set_postfix_str(f"repeat {repeat} {variant} N={n} concurrency {concurrency}")
            mine = problems[: args.waves * concurrency]
            requests = search_requests(testbed, mine, variant, args.seed, **search_settings(args, n))
            batch = run_batch(fresh_runtime(testbed, concurrency), requests, bar)
            runs.append({"variant": variant, "beam_size": n, "concurrency": concurrency, "repeat": repeat,
                         **serving_numbers(batch, mine)})
    return runs


def summarize(runs: list[dict], cells, total_blocks: int) -> dict:
    """results[variant][beam size]["concurrency"][concurrency] = medians over repeats."""
    results: dict = {}
    for variant, n, concurrency in cells:
        mine = [{k: v for k, v in r.items() if k != "repeat"} for r in runs
                if (r["variant"], r["beam_size"], r["concurrency"]) == (variant, n, concurrency)]
        cell = median_summary(mine)
        cell["peak_kv_share"] = cell["peak_kv_blocks"] / total_blocks
        by_size = results.setdefault(variant, {}).setdefault(str(n), {"concurrency": {}})
        by_size["concurrency"][str(concurrency)] = cell
    return results


def report(results: dict) -> str:
    rows = []
    for variant, by_size in results.items():
        for n, sweep in sorted(by_size.items(), key=lambda item: int(item[0])):
            for concurrency, c in sorted(sweep["concurrency"].items(), key=lambda item: int(item[0])):
                rows.append([variant, int(n), int(concurrency), c["output_tokens_per_s"], c["requests_per_s"],
                             c["generated_tokens_per_s"], 100 * c["generation_s"] / c["elapsed_s"],
                             100 * c["verification_s"] / c["elapsed_s"], c["physical_to_logical"], c["peak_kv_blocks"],
                             100 * c["peak_kv_share"]])
    header = ["variant", "N", "concurrency", "output tok/s", "req/s", "generated tok/s", "gen %", "PRM %",
              "phys/log", "peak KV blocks", "peak KV %"]
    return "\n## Beam size and concurrency (medians over repeats)\n\n" + markdown_table(header, rows)


def plot(results: dict, args):
    figure, (by_size, by_concurrency, memory) = new_figure(1, 3, width=5.0)
    for variant, sizes in results.items():
        size_sweep = size_points(sizes, args.max_concurrency)
        line, = by_size.plot(*series(size_sweep, "output_tokens_per_s"), "o-", label=variant)
        memory.plot(*series(size_sweep, "peak_kv_blocks"), "o-", color=line.get_color(), label=f"{variant}, by N")
        concurrency_sweep = concurrency_points(sizes, args.concurrency_beam_size)
        by_concurrency.plot(*series(concurrency_sweep, "output_tokens_per_s"), "o-", color=line.get_color(),
                            label=variant)
        memory.plot(*series(concurrency_sweep, "peak_kv_blocks"), "s--", color=line.get_color(),
                    label=f"{variant}, by concurrency")
    by_size.set_xlabel(f"beam size N (concurrency {args.max_concurrency})")
    by_concurrency.set_xlabel(f"requests in flight (N = {args.concurrency_beam_size})")
    memory.set_xlabel("N (solid) or concurrency (dashed)")
    memory.set_ylabel("peak KV blocks in use")
    for axis in (by_size, by_concurrency):
        axis.set_xscale("log", base=2)
        axis.set_ylabel("output tokens / s")
    for axis in (by_size, by_concurrency, memory):
        axis.legend(fontsize=8)
    return figure


def size_points(sizes: dict, concurrency: int) -> list[tuple[int, dict]]:
    """(N, cell) of the beam-size sweep (at the given concurrency), by N."""
    return sorted((int(n), sweep["concurrency"][str(concurrency)]) for n, sweep in sizes.items()
                  if str(concurrency) in sweep["concurrency"])


def concurrency_points(sizes: dict, beam_size: int) -> list[tuple[int, dict]]:
    """(concurrency, cell) of the concurrency sweep (at the given N), by concurrency."""
    sweep = sizes.get(str(beam_size), {"concurrency": {}})["concurrency"]
    return sorted((int(c), cell) for c, cell in sweep.items())


def series(points: list[tuple[int, dict]], key: str) -> tuple[list[int], list[float]]:
    return [x for x, _ in points], [cell[key] for _, cell in points]
