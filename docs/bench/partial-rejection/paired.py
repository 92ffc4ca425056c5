"""Partial-step rejection on the simulated A100 (7B pair), problem by problem (docs/bench/partial-rejection.md):
each variant against `beam` on the same problems and seeds (the pairing `specscale bench accuracy` uses; the
problem is the unit of the 95% CI), with the virtual time, generated and PRM tokens and the steps stopped.

    python docs/bench/partial-rejection/paired.py --workload W.json --problems 300 --seeds 3 \\
        --variants 'beam,specscale,specscale+reject[partial_tokens=32,partial_margin=0.1]' --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics

from specscale.search.presets import split_variants
from specscale.sim.workload import WorkloadParams
from specscale_lab.bench.accuracy import paired_difference
from specscale_lab.bench.numbers import is_right
from specscale_lab.bench.sim_batch import simulated_batch


def run(variant: str, seed: int, args, workload: WorkloadParams) -> dict:
    with simulated_batch(variant, seed, args.problems, args.in_flight, args.beam_size, workload) as batch:
        metrics = batch.runtime.take_metrics()
        return dict(variant=variant, seed=seed, virtual_s=batch.elapsed_s,
                    right=[int(is_right(p, r)) for p, r in zip(batch.problems, batch.results, strict=True)],
                    generated=sum(r.usage.generated_tokens for r in batch.results),
                    prm_tokens=sum(metrics.verifier_batch_tokens), prm_calls=len(metrics.verifier_batch_items),
                    stopped=sum(batch.runtime.search(rid).partial.rejected_copies for rid in batch.request_ids))


def report(runs: list[dict], base: str) -> list[dict]:
    rows = []
    for variant in dict.fromkeys(r["variant"] for r in runs):
        mine = {r["seed"]: r for r in runs if r["variant"] == variant}
        theirs = {r["seed"]: r for r in runs if r["variant"] == base}
        seeds = sorted(set(mine) & set(theirs))
        diff = paired_difference({s: mine[s]["right"] for s in seeds}, {s: theirs[s]["right"] for s in seeds})
        rows.append(dict(variant=variant, seeds=len(seeds), accuracy=statistics.fmean(
            v for s in seeds for v in mine[s]["right"]), diff_to_base=diff,
            requests_per_s_x_base=statistics.median(theirs[s]["virtual_s"] / mine[s]["virtual_s"] for s in seeds),
            generated_x_base=median_ratio(mine, theirs, seeds, "generated"),
            prm_tokens_x_base=median_ratio(mine, theirs, seeds, "prm_tokens"),
            generated=statistics.median(mine[s]["generated"] for s in seeds),
            prm_tokens=statistics.median(mine[s]["prm_tokens"] for s in seeds),
            stopped=statistics.median(mine[s]["stopped"] for s in seeds)))
    return rows


def median_ratio(mine: dict, theirs: dict, seeds: list[int], key: str) -> float:
    return statistics.median(mine[s][key] / theirs[s][key] for s in seeds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", required=True, help="a workload JSON (WorkloadParams.to_json)")
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--variants", required=True)
    parser.add_argument("--reuse", default=None, help="an earlier --out whose runs of the same variant and seed are kept")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.workload) as f:
        workload = WorkloadParams.from_json(json.load(f))
    variants = split_variants(args.variants)
    earlier = {}
    if args.reuse:
        with open(args.reuse) as f:
            earlier = {(r["variant"], r["seed"]): r for r in json.load(f)["runs"]}
    runs = []
    for seed in range(args.seeds):
        for variant in variants:
            runs.append(earlier.get((variant, seed)) or run(variant, seed, args, workload))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "right"}), flush=True)
    rows = report(runs, variants[0])
    with open(args.out, "w") as f:
        json.dump(dict(args=vars(args), rows=rows, runs=runs), f)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
