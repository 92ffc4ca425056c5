"""The speculative row budget and the survival ranking of speculative rows, on the simulator
(docs/design.md "Speculation", docs/bench/sim-a100-7b.md "The row budget and survival ranking").

Each speculative preset runs four ways on the same simulated problems and paired seeds, all issued at once
with at most `--max-concurrency` in flight: the device's row budget (row_budget.py, derived from the cost
model) or no budget (speculative rows may fill the scheduler's 512 rows), and speculative rows ranked by
their parent's survival rank or oldest first (`rank_speculation = False`). Reported: output tokens/s,
requests/s, the share of generated tokens cancelled, generator and PRM seconds, generating sequences per
iteration.

    nice -n 10 python benchmarks/speculation_budget.py --problems 100 --out docs/bench/sim/a100-7b-speculation-budget
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from specscale.sim.simulation import Simulation, SimulationConfig
from specscale_lab.bench.numbers import serving_numbers
from specscale_lab.bench.outputs import markdown_table
from specscale_lab.bench.runs import fresh_runtime, run_batch, search_requests

UNBOUNDED = 512  # the scheduler's max_num_seqs: speculation may fill the batch
WAYS = (  # (label, budgeted, ranked)
    ("device budget, ranked", True, True),
    ("device budget, oldest first", True, False),
    ("no budget, ranked", False, True),
    ("no budget, oldest first", False, False),
)


def run_way(args, preset: str, budgeted: bool, ranked: bool) -> dict:
    sim = Simulation(SimulationConfig(hardware=args.hardware, generator=args.generator, prm=args.prm,
                                      dataset=args.dataset, seed=args.seed,
                                      spare_rows=None if budgeted else UNBOUNDED))
    problems = sim.problems(args.problems)
    requests = search_requests(sim, problems, preset, args.seed, beam_size=args.beam_size, beam_width=4,
                               rank_speculation=ranked)
    batch = run_batch(fresh_runtime(sim, args.max_concurrency), requests)
    numbers = serving_numbers(batch, problems)
    sequences = batch.runtime.metrics.physical_sequences
    numbers.update(spare_rows=sim.engine.scheduler.spare_rows,
                   sequences_per_iteration=statistics.fmean(sequences) if sequences else 0.0)
    sim.close()
    return numbers


def report(results: dict, args) -> str:
    header = ["preset", "way", "row budget", "output tok/s", "req/s", "cancelled share", "gen s", "PRM s",
              "sequences/iter", "accuracy"]
    rows = [[preset, way, r["spare_rows"], r["output_tokens_per_s"], r["requests_per_s"], r["wasted_share"],
             r["generation_s"], r["verification_s"], r["sequences_per_iteration"], r["accuracy"]]
            for preset, ways in results.items() for way, r in ways.items()]
    return (f"\n{args.generator} + {args.prm} on {args.hardware}, {args.problems} {args.dataset} problems, "
            f"N = {args.beam_size}, ≤ {args.max_concurrency} in flight\n\n" + markdown_table(header, rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="a100-80gb")
    parser.add_argument("--generator", default="qwen2.5-7b-instruct")
    parser.add_argument("--prm", default="qwen2.5-math-prm-7b")
    parser.add_argument("--dataset", default="math500")
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--presets", type=lambda text: text.split(","), default=["naive-spec", "ep", "specscale"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict = {}
    for preset in args.presets:
        for label, budgeted, ranked in WAYS:
            results.setdefault(preset, {})[label] = run_way(args, preset, budgeted, ranked)
            print(f"{preset}, {label}: {results[preset][label]['output_tokens_per_s']:.0f} output tok/s",
                  file=sys.stderr)
    text = report(results, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"command": shlex.join(sys.argv), "results": results}, indent=2))
    (out / "speculation-budget.md").write_text(
        f"# Speculative row budget and survival ranking\n\n```bash\n{shlex.join(sys.argv)}\n```\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
