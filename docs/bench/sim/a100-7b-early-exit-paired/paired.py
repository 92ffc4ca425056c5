"""Early exit on the simulated A100 (7B pair), problem by problem (docs/bench/early-exit.md): each variant against
its base on the same problems and seeds, the same problem-seed pairing `specscale bench accuracy` uses: does the
exact exit return the base's answer and path, what does each variant cost in accuracy (paired 95% CI, the
problem the unit), how many tokens does it generate, how often does each exit fire.

    flock /tmp/specscale-cpu.lock python docs/bench/sim/a100-7b-early-exit-paired/paired.py \\
        --problems 300 --seeds 3 --in-flight 32 --out docs/bench/sim/a100-7b-early-exit-paired/c32.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from specscale.search.presets import split_variants
from specscale_lab.bench.accuracy import accuracy_ci, paired_difference
from specscale_lab.bench.numbers import is_right, vote_is_right
from specscale_lab.bench.sim_batch import simulated_batch

PAIRS = ("beam:beam+exit,specscale:specscale+exit,specscale:specscale+exit-soft[exit_certainty=0.95],"
         "specscale:specscale+exit-soft[exit_certainty=0.8],specscale:specscale+exit-soft[exit_certainty=0.6],"
         "specscale:specscale+exit-stall,specscale:specscale+exit-stall[exit_floor=0.9],"
         "specscale:specscale+exit-stall[exit_floor=0.9,exit_stall_rounds=1],"
         "specscale:specscale+exit-stall[exit_floor=0.99,exit_stall_rounds=1]")


def run(variant: str, seed: int, problems: int, in_flight: int, beam_size: int) -> list[dict]:
    with simulated_batch(variant, seed, problems, in_flight, beam_size) as batch:
        return [{"right": int(is_right(p, r)), "answer": r.answer, "path": r.best.text if r.best else None,
                 "vote": r.weighted_vote, "vote_right": int(vote_is_right(p, r.weighted_vote)),
                 "generated": r.usage.generated_tokens, "exit": getattr(r, "early_exit", ""),
                 "elapsed_s": batch.elapsed_s}
                for p, r in zip(batch.problems, batch.results, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--pairs", default=PAIRS, help="base:variant,... (variants may carry [field=value])")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    pairs = [tuple(p.split(":", 1)) for p in split_variants(args.pairs)]
    variants = list(dict.fromkeys(v for pair in pairs for v in pair))
    started = time.time()
    runs = {v: {s: run(v, s, args.problems, args.in_flight, args.beam_size) for s in range(args.seeds)}
            for v in variants}
    rows = {}
    for base, variant in pairs:
        a, b = runs[base], runs[variant]
        keys = [(s, i) for s in a for i in range(args.problems)]
        right_a = {s: [x["right"] for x in a[s]] for s in a}
        right_b = {s: [x["right"] for x in b[s]] for s in b}
        tokens_a = sum(a[s][i]["generated"] for s, i in keys)
        tokens_b = sum(b[s][i]["generated"] for s, i in keys)
        rows[variant] = {
            "base": base,
            "problem_seeds": len(keys),
            "same_answer": sum(a[s][i]["answer"] == b[s][i]["answer"] for s, i in keys) / len(keys),
            "same_path": sum(a[s][i]["path"] == b[s][i]["path"] for s, i in keys) / len(keys),
            "same_weighted_vote": sum(a[s][i]["vote"] == b[s][i]["vote"] for s, i in keys) / len(keys),
            "weighted_vote_difference": paired_difference({s: [x["vote_right"] for x in b[s]] for s in b},
                                                          {s: [x["vote_right"] for x in a[s]] for s in a}),
            "accuracy": accuracy_ci(right_b), "base_accuracy": accuracy_ci(right_a),
            "difference": paired_difference(right_b, right_a),
            "generated_tokens": tokens_b, "base_generated_tokens": tokens_a, "tokens_ratio": tokens_b / tokens_a,
            "exits": dict(Counter(b[s][i]["exit"] or "none" for s, i in keys)),
            "virtual_s": sum(b[s][0]["elapsed_s"] for s in b), "base_virtual_s": sum(a[s][0]["elapsed_s"] for s in a),
        }
    out = {"args": vars(args), "wall_s": time.time() - started, "pairs": rows}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    for variant, r in rows.items():
        d = r["difference"]
        print(f"{variant:48s} vs {r['base']:10s} same answer {100 * r['same_answer']:6.2f}%  path "
              f"{100 * r['same_path']:6.2f}%  vote {100 * r['same_weighted_vote']:6.2f}%  acc {100 * r['accuracy']['mean']:5.1f}% "
              f"(diff {100 * d['mean']:+.2f} pp, CI {100 * d['ci95_low']:+.2f}..{100 * d['ci95_high']:+.2f})  "
              f"tokens x{r['tokens_ratio']:.3f}  virtual s x{r['virtual_s'] / r['base_virtual_s']:.3f}  {r['exits']}")


if __name__ == "__main__":
    main()
