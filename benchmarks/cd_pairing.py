"""Share of (problem, seed) pairs on which a CD variant returns exactly its plain twin's paths (docs/design.md,
"Seeds"): given equal logits, computation deduplication changes only the cost, so `beam+cd` should return
`beam`'s best path (and its whole path multiset) on nearly every problem-seed of the toy task.

    python benchmarks/cd_pairing.py --problems 40 --seeds 2 --beam-size 8 [--pairs beam:beam+cd ep-strict:ep+cd]
"""

from __future__ import annotations

import argparse
import time

from specscale.pipeline import Pipeline, PipelineConfig
from specscale_lab.bench.runs import fresh_runtime, run_batch, search_requests, toy_workload
from specscale_lab.bench.testbed import RealTestbed


def path_multiset(result) -> list[tuple[str, int]]:
    """The returned paths as (text, copies), copies of one text merged whatever the physical grouping."""
    merged: dict[str, int] = {}
    for p in result.paths:
        merged[p.text] = merged.get(p.text, 0) + p.copies
    return sorted(merged.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--max-rounds", type=int, default=40)
    parser.add_argument("--pairs", nargs="+", default=["beam:beam+cd"], help="plain:cd preset pairs")
    args = parser.parse_args()
    pipeline = Pipeline(PipelineConfig())
    problems = toy_workload(args.problems)
    config = dict(beam_size=args.beam_size, beam_width=args.beam_width, max_rounds=args.max_rounds)
    cache: dict[tuple[str, int], list] = {}
    for pair in args.pairs:
        plain, cd = pair.split(":")
        same_best = same_all = total = 0
        started = time.perf_counter()
        for seed in range(args.seeds):
            for preset in (plain, cd):
                if (preset, seed) not in cache:
                    requests = search_requests(RealTestbed(pipeline), problems, preset, seed, **config)
                    cache[preset, seed] = run_batch(fresh_runtime(pipeline, 32), requests).results
            for a, b in zip(cache[plain, seed], cache[cd, seed], strict=True):
                total += 1
                same_best += (a.best.text if a.best else None) == (b.best.text if b.best else None)
                same_all += path_multiset(a) == path_multiset(b)
        print(f"{cd} vs {plain}: same best path {same_best}/{total} ({100 * same_best / total:.1f}%), "
              f"same returned paths {same_all}/{total} ({100 * same_all / total:.1f}%), "
              f"{time.perf_counter() - started:.0f} s")
    pipeline.close()


if __name__ == "__main__":
    main()
