"""`specscale bench sweep-lv`: the lazy-verification trade-off (docs/design.md, "Verification").

`specscale` under load (all requests at once) with the flush threshold swept over `--thresholds`
PRM tokens at the default deferral cap, and the deferral cap swept over `--deferral-caps` at the
default threshold (the profiled one, else 2048); `ep+cd` (the same search, every step verified at
once) is the reference. Per point (medians over repeats, points interleaved within each repeat):
output tokens/s, PRM calls and their median size in tokens, wasted tokens, and which trigger flushed
the queue. Too high a threshold delays pruning; this shows by how much.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specscale.config import SearchConfig
from specscale.runtime.device_properties import DeviceProperties
from specscale_lab.bench.arguments import add_common_arguments, int_list, search_settings
from specscale_lab.bench.numbers import median_summary, serving_numbers
from specscale_lab.bench.outputs import finish_info, markdown_table, new_figure, write_outputs
from specscale_lab.bench.runs import fresh_runtime, interleaved, progress_bar, run_batch, search_requests, start_run

NAME = "sweep-lv"
REFERENCE = "ep+cd"
FULL = {"problems": 64, "repeats": 3, "beam_sizes": [8], "max_rounds": 40,
        "thresholds": [256, 512, 1024, 2048, 4096], "deferral_caps": [0, 2, 4, 6, 10, 16]}
QUICK = {"problems": 6, "repeats": 2, "beam_sizes": [4], "max_rounds": 8, "thresholds": [256, 2048],
         "deferral_caps": [0, 6]}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(NAME, help="lazy-verification threshold and deferral cap against throughput")
    add_common_arguments(parser, variants=False)
    parser.add_argument("--thresholds", type=int_list, default=None, help="flush thresholds in PRM tokens")
    parser.add_argument("--deferral-caps", type=int_list, default=None, help="deferral caps")
    parser.set_defaults(func=run)


def run(args) -> int:
    testbed, info, started = start_run(NAME, args, FULL, QUICK, ["specscale", REFERENCE])
    problems = testbed.problems(args.problems)
    points = sweep_points(args.thresholds, args.deferral_caps, testbed.device.lv_threshold_tokens)
    cells = [(label, n) for n in args.beam_sizes for label in points]
    runs = measure(testbed, args, problems, cells, points)
    testbed.close()
    results = summarize(runs, cells, points)
    info = finish_info(info, started)
    text = report(results)
    write_outputs(args.out, NAME, info, runs, results, text, plot(results, args.beam_sizes), {"points": points})
    print(text)
    return 0


def sweep_points(thresholds: list[int], caps: list[int], default_threshold: int) -> dict[str, dict]:
    """label -> (preset, overrides): the reference, the threshold sweep, the deferral-cap sweep."""
    default_cap = SearchConfig.lv_max_deferrals
    settings = [(t, default_cap) for t in thresholds] + [(default_threshold, d) for d in caps]
    points: dict[str, dict[str, Any]] = {REFERENCE: {"preset": REFERENCE, "overrides": {}}}
    for threshold, cap in dict.fromkeys(settings):
        points[f"specscale lv={threshold} defer={cap}"] = {
            "preset": "specscale", "threshold": threshold, "deferral_cap": cap,
            "overrides": {"lv_max_deferrals": cap},
            "sweeps": sweeps_of(threshold, cap, default_threshold, default_cap),
        }
    return points


def sweeps_of(threshold: int, cap: int, default_threshold: int, default_cap: int) -> list[str]:
    """Which sweep lines a point lies on: the threshold sweep holds the cap, the cap sweep the threshold."""
    return ["threshold"] * (cap == default_cap) + ["deferral_cap"] * (threshold == default_threshold)


def measure(testbed, args, problems, cells, points) -> list[dict]:
    runs = []
    with progress_bar(len(cells) * args.repeats * len(problems), NAME) as bar:
        for repeat, (label, n) in interleaved(cells, args.repeats):
            bar.set_postfix_str(f"repeat {repeat} {label} N={n}")
            point = points[label]
            requests = search_requests(testbed, problems, point["preset"], args.seed,
                                       **search_settings(args, n), **point["overrides"])
            device = device_at(testbed.device, point.get("threshold"))
            runtime = fresh_runtime(testbed, args.max_concurrency, device=device)
            batch = run_batch(runtime, requests, bar)
            runs.append({"variant": label, "beam_size": n, "repeat": repeat, **serving_numbers(batch, problems),
                         "flush_reasons": batch.runtime.flush_reasons})
    return runs


def device_at(device: DeviceProperties, threshold: int | None) -> DeviceProperties:
    """The stack's device properties with a sweep point's LV threshold (None: the stack's own)."""
    return device if threshold is None else replace(device, lv_threshold_tokens=threshold)


def summarize(runs: list[dict], cells, points) -> dict:
    results: dict = {}
    for label, n in cells:
        mine = [r for r in runs if r["variant"] == label and r["beam_size"] == n]
        cell = median_summary([{k: v for k, v in r.items() if k != "repeat"} for r in mine])
        cell["flush_reasons"] = {k: sum(r["flush_reasons"].get(k, 0) for r in mine)
                                 for k in sorted({k for r in mine for k in r["flush_reasons"]})}
        cell.update({k: v for k, v in points[label].items() if k in ("threshold", "deferral_cap", "sweeps")})
        results.setdefault(label, {})[str(n)] = cell
    return results


def report(results: dict) -> str:
    rows = []
    for label, by_size in results.items():
        for n, c in by_size.items():
            reasons = ", ".join(f"{k} {v}" for k, v in c["flush_reasons"].items()) or None
            rows.append([label, int(n), c["output_tokens_per_s"], c["verifier_calls"],
                         c["verifier_batch_tokens_median"], c["verification_s"], c["wasted_tokens"],
                         c["generated_tokens"], reasons])
    header = ["setting", "N", "output tok/s", "PRM calls", "tokens/call", "PRM s", "wasted tok", "generated tok",
              "flushes (all repeats)"]
    title = "\n## Lazy verification: threshold and deferral cap (medians over repeats)\n\n"
    return title + markdown_table(header, rows)


def plot(results: dict, beam_sizes: list[int]):
    figure, (by_threshold, by_cap) = new_figure(1, 2)
    for n in map(str, beam_sizes):
        reference = results[REFERENCE][n]["output_tokens_per_s"]
        for axis, sweep, key in ((by_threshold, "threshold", "threshold"), (by_cap, "deferral_cap", "deferral_cap")):
            points = sorted((c[key], c["output_tokens_per_s"]) for by_size in results.values()
                            for size, c in by_size.items() if size == n and sweep in c.get("sweeps", []))
            line, = axis.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"specscale N={n}")
            axis.axhline(reference, color=line.get_color(), linestyle=":", label=f"{REFERENCE} N={n}")
    by_threshold.set_xscale("log", base=2)
    by_threshold.set_xlabel("flush threshold (PRM tokens)")
    by_cap.set_xlabel("deferral cap (ticks)")
    for axis in (by_threshold, by_cap):
        axis.set_ylabel("output tokens / s")
        axis.legend(fontsize=8)
    return figure
