"""The adaptive lazy-verification flush policy against the fixed triggers, on the simulator
(docs/design.md "Verification", docs/bench/simulator-scale.md "Adaptive lazy verification").

Every setting serves the same simulated problems with the same paired seeds, all issued at once with at
most `--max-concurrency` in flight, on one simulated device (default: Qwen2.5-7B-Instruct +
Qwen2.5-Math-PRM-7B on an A100-80GB, MATH-500-shaped workload). Settings: `ep+cd` (verify at once),
`specscale` with the fixed triggers at the profiled knee, `specscale-adaptive`, and the adaptive policy
without its speculative-work term (an ablation is a configuration).

    nice -n 10 python benchmarks/adaptive_lv.py --problems 200 --beam-size 8 --out docs/bench/adaptive-lv-a100

The real-CPU side is `specscale bench throughput --variants ep+cd,specscale,specscale-adaptive`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale_lab.bench.outputs import markdown_table
from specscale_lab.bench.runs import fresh_runtime, paired_seed, run_batch

SETTINGS = (  # (label, preset, overrides)
    ("ep+cd (verify at once)", "ep+cd", {}),
    ("specscale, fixed, knee", "specscale", {}),
    ("specscale-adaptive", "specscale-adaptive", {}),
    ("specscale-adaptive, no speculative term", "specscale-adaptive", {"lv_speculative_budget_tokens": 1e12}),
    ("specscale-adaptive, no ride-along", "specscale-adaptive", {"lv_ride_along": False}),
    ("specscale, fixed, knee, ride-along", "specscale", {"lv_ride_along": True}),
)
DEFAULT_SETTINGS = [label for label, _, _ in SETTINGS[:4]]


def run_setting(sim: Simulation, problems, preset: str, overrides: dict, args) -> dict:
    requests = [sim.request(p, preset_config(preset, seed=paired_seed(args.seed, i), beam_size=args.beam_size,
                                             beam_width=4, **overrides), f"{preset} {i}")
                for i, p in enumerate(problems)]
    started = time.process_time()
    batch = run_batch(fresh_runtime(sim, args.max_concurrency), requests)
    metrics = batch.runtime.metrics.summary()
    usage = [r.usage for r in batch.results]
    latencies = sorted(r.timings.total_s for r in batch.results)
    return {
        "elapsed_s": batch.elapsed_s, "output_tokens_per_s": sum(u.output_tokens for u in usage) / batch.elapsed_s,
        "requests_per_s": len(usage) / batch.elapsed_s,
        "accuracy": sum(r.answer == p.answer for r, p in zip(batch.results, problems, strict=True)) / len(problems),
        "generated_tokens": sum(u.generated_tokens for u in usage),
        "wasted_tokens": sum(u.wasted_tokens for u in usage),
        "verification_s": metrics["verification_s"], "generation_s": metrics["generation_s"],
        "verifier_calls": metrics["verifier_calls"], "tokens_per_call": metrics["verifier_batch_tokens_median"],
        "peak_kv_blocks": metrics["peak_kv_blocks"], "latency_p50_s": latencies[len(latencies) // 2],
        "flush_reasons": dict(batch.runtime.flush_reasons), "cpu_s": time.process_time() - started,
    }


def report(results: dict, sim: Simulation, args) -> str:
    header = ["setting", "output tok/s", "vs fixed knee", "PRM calls", "tokens/call", "PRM s", "gen s",
              "wasted tokens", "p50 latency s", "accuracy", "flushes"]
    base = results.get("specscale, fixed, knee", {}).get("output_tokens_per_s")
    rows = [[label, r["output_tokens_per_s"], f"{r['output_tokens_per_s'] / base:.3f}" if base else "—",
             r["verifier_calls"],
             r["tokens_per_call"], r["verification_s"], r["generation_s"], r["wasted_tokens"], r["latency_p50_s"],
             f"{100 * r['accuracy']:.1f}%", ", ".join(f"{k} {v}" for k, v in sorted(r["flush_reasons"].items()))]
            for label, r in results.items()]
    return (f"\n{args.generator} + {args.prm} on {args.hardware}, {args.problems} {args.dataset} problems, "
            f"N = {args.beam_size}, ≤ {args.max_concurrency} in flight, LV knee {sim.device.lv_threshold_tokens} tokens\n\n"
            + markdown_table(header, rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hardware", default="a100-80gb")
    parser.add_argument("--generator", default="qwen2.5-7b-instruct")
    parser.add_argument("--prm", default="qwen2.5-math-prm-7b")
    parser.add_argument("--dataset", default="math500")
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--max-concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--settings", type=lambda text: text.split(";"), default=DEFAULT_SETTINGS,
                        help=f"';'-separated labels of {[label for label, _, _ in SETTINGS]}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sim = Simulation(SimulationConfig(hardware=args.hardware, generator=args.generator, prm=args.prm,
                                      dataset=args.dataset, seed=args.seed))
    problems = sim.problems(args.problems)
    results = {}
    for label, preset, overrides in (s for s in SETTINGS if s[0] in args.settings):
        results[label] = run_setting(sim, problems, preset, overrides, args)
        print(f"{label}: {results[label]['output_tokens_per_s']:.0f} output tok/s", file=sys.stderr)
    text = report(results, sim, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"command": shlex.join(sys.argv), "results": results}, indent=2))
    (out / "adaptive-lv.md").write_text(f"# Adaptive lazy verification\n\n```bash\n{shlex.join(sys.argv)}\n```\n{text}")
    print(text)
    sim.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
