"""KV-aware retention on the simulated A100 (7B pair), problem by problem (docs/bench/kv-retention.md): each variant
against `beam` on the same problems and seeds (the pairing `specscale bench accuracy` uses): paired accuracy
(95% CI, the problem the unit), the share of problem-seeds with beam's path, generated tokens, requests/s and
peak KV blocks (medians of per-seed ratios), and how many searches fit in flight in the KV budget beam's peak
takes at --in-flight: in_flight x budget / peak (linear in the searches in flight), and, with --ladder, the most
of the ladder's levels (seed 0) whose measured peak fits. Each run is appended to <out>.jsonl as it ends, and a
rerun skips the runs that file holds.

    python benchmarks/kv_retention_paired.py --problems 300 --seeds 3 --in-flight 32 --beam-sizes 8 \\
        --out results/kv-retention-paired.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from specscale.search.presets import split_variants
from specscale_lab.bench.accuracy import accuracy_ci, paired_difference
from specscale_lab.bench.numbers import is_right
from specscale_lab.bench.sim_batch import simulated_batch

VARIANTS = "beam,specscale,beam+kv,specscale+kv,specscale+kv[retention_margin=0.1]"


def run(cell: tuple[str, int, int, int, int]) -> dict:
    """One batch on the simulator: per-problem outcomes and the run's virtual time and peak KV blocks."""
    variant, beam_size, seed, problems, in_flight = cell
    with simulated_batch(variant, seed, problems, in_flight, beam_size) as batch:
        return {"cell": list(cell), "virtual_s": batch.elapsed_s, "peak_kv_blocks": batch.runtime.metrics.peak_kv_blocks,
                "kv_blocks": batch.sim.engine.block_manager.num_blocks,
                "right": [int(is_right(p, r)) for p, r in zip(batch.problems, batch.results, strict=True)],
                "paths": [r.best.text if r.best else None for r in batch.results],
                "generated": sum(r.usage.generated_tokens for r in batch.results)}


def ratio(runs: dict, variant: str, base: str, key: str, seeds: list[int], invert: bool = False) -> float:
    """Median over seeds of the per-seed ratio variant / base (base / variant with invert: a rate from a time)."""
    values = [runs[variant][s][key] / runs[base][s][key] for s in seeds]
    return statistics.median(1 / v if invert else v for v in values)


def compare(runs: dict, variant: str, base: str, seeds: list[int]) -> dict:
    right = {s: runs[variant][s]["right"] for s in seeds}
    base_right = {s: runs[base][s]["right"] for s in seeds}
    pairs = [(a, b) for s in seeds for a, b in zip(runs[variant][s]["paths"], runs[base][s]["paths"], strict=True)]
    return {"accuracy": accuracy_ci(right), "difference": paired_difference(right, base_right),
            "same_path": sum(a == b for a, b in pairs) / len(pairs),
            "requests_per_s_ratio": ratio(runs, variant, base, "virtual_s", seeds, invert=True),
            "generated_ratio": ratio(runs, variant, base, "generated", seeds),
            "peak_kv_ratio": ratio(runs, variant, base, "peak_kv_blocks", seeds),
            "peak_kv_blocks": statistics.median(runs[variant][s]["peak_kv_blocks"] for s in seeds),
            "requests_per_s": statistics.median(len(runs[variant][s]["right"]) / runs[variant][s]["virtual_s"]
                                                for s in seeds)}


def fits(ladder: dict, budget: float) -> int | None:
    """The most searches in flight (of the ladder's levels) whose peak KV fits the budget."""
    levels = [level for level, peak in sorted(ladder.items()) if peak <= budget]
    return levels[-1] if levels else None


def measured(cells: list, jsonl: Path, workers: int) -> list[dict]:
    """Every cell's record: those jsonl holds, the others run now and appended as each ends."""
    done = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    have = {tuple(r["cell"]) for r in done}
    todo = [c for c in cells if tuple(c) not in have]
    with ProcessPoolExecutor(workers) as pool, jsonl.open("a") as sink:
        for record in pool.map(run, todo):
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            done.append(record)
    return done


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--beam-sizes", default="8,4")
    parser.add_argument("--variants", default=VARIANTS, help="comma-separated; beam first (the base)")
    parser.add_argument("--ladder", default="", help="in-flight levels (seed 0) to check the KV budget on")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    variants, seeds = split_variants(args.variants), list(range(args.seeds))
    sizes = [int(n) for n in args.beam_sizes.split(",")]
    levels = [int(c) for c in args.ladder.split(",") if c]
    cells = [(v, n, s, args.problems, args.in_flight) for n in sizes for v in variants for s in seeds]
    cells += [(v, n, 0, args.problems, c) for n in sizes for v in variants for c in levels if c != args.in_flight]
    started = time.time()
    records = measured([list(c) for c in cells], Path(args.out).with_suffix(".jsonl"), args.workers)
    out: dict = {"args": vars(args), "results": {}}
    for n in sizes:
        runs = {v: {r["cell"][2]: r for r in records if r["cell"][:2] == [v, n] and r["cell"][4] == args.in_flight}
                for v in variants}
        ladders = {v: {r["cell"][4]: r["peak_kv_blocks"] for r in records if r["cell"][:3] == [v, n, 0]}
                   for v in variants}
        budget = statistics.median(runs[variants[0]][s]["peak_kv_blocks"] for s in seeds)
        rows = {v: compare(runs, v, variants[0], seeds) for v in variants}
        for v, row in rows.items():
            row["in_flight_in_budget_linear"] = args.in_flight * budget / row["peak_kv_blocks"]
            row["in_flight_in_budget_ladder"] = fits(ladders[v], budget) if levels else None
        out["results"][n] = {"kv_budget_blocks": budget, "ladders": ladders, "variants": rows}
    out["wall_s"] = time.time() - started
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    for n, result in out["results"].items():
        for v, r in result["variants"].items():
            d = r["difference"]
            print(f"N={n} {v:36s} acc {100 * r['accuracy']['mean']:5.1f}% diff {100 * d['mean']:+.2f} "
                  f"[{100 * d['ci95_low']:+.2f}, {100 * d['ci95_high']:+.2f}] same path {100 * r['same_path']:5.1f}% "
                  f"req/s x{r['requests_per_s_ratio']:.3f} tokens x{r['generated_ratio']:.3f} "
                  f"peak KV {r['peak_kv_blocks']:.0f} x{r['peak_kv_ratio']:.3f} "
                  f"in budget {r['in_flight_in_budget_linear']:.1f} / {r['in_flight_in_budget_ladder']}")


if __name__ == "__main__":
    main()
