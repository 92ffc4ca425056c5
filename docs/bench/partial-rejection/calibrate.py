"""Partial-step scores of the bundled toy models against the full step's score (docs/simulator.md, "Partial-step
scores"). Runs `beam` on toy problems with the real toy generator and PRM, then re-scores every scored
non-final step with only its first tau tokens written (the path's earlier steps whole) and reports, per tau and
per fraction of the step written, how the partial score relates to the full one: correlation, the spread of
their difference, and how often a step below its round's k-th best reads above it (and the reverse).

    python docs/bench/partial-rejection/calibrate.py --problems 40 --out /tmp/partial-calibration.json
    python docs/bench/partial-rejection/calibrate.py --problems 40 --sim --taus 16,32,48 --out /tmp/partial-sim.json

--sim runs the same on the simulator's A100 Qwen 7B pair (math500 workload): what its PRM model implies at the
workload's partial_correlation (--partial-correlation).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

from specscale.pipeline import Pipeline, PipelineConfig
from specscale.seam import ScoreRequest
from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import preset
from specscale.stack import Stack
from specscale_lab.tasks.toy import toy_problems


def traces(stack: Stack, requests: list, beam_size: int) -> list[dict]:
    """Every scored non-final step of `beam` runs: its round, path steps, full score and the round's k-th best."""
    runtime = stack.runtime(max_concurrency=8)
    runtime.run(requests)
    steps = []
    for i, request in enumerate(requests):
        question = request.question
        search = runtime.search(f"q{i}")
        for rd in search.rounds[:-1]:
            scored = [c for c in rd.candidates if c.score is not None and not c.completed]
            ranked = sorted((c.score for c in rd.candidates if c.score is not None), reverse=True)
            kth = ranked[search.k - 1] if len(ranked) >= search.k else None
            steps += [dict(question=question, steps=c.steps(), score=c.score, kth=kth) for c in scored]
    return steps


def partial_scores(pipeline: Stack, steps: list[dict], tau: int) -> list[tuple[dict, float, float]]:
    """(step, fraction written, partial score) for every step longer than tau tokens."""
    tokenizer = pipeline.tokenizer
    requests, kept = [], []
    for s in steps:
        ids = tokenizer.encode(s["steps"][-1])
        if len(ids) <= tau:
            continue
        requests.append(ScoreRequest(s["question"], tuple(s["steps"][:-1]) + (tokenizer.decode(ids[:tau]),)))
        kept.append((s, tau / len(ids)))
    results = pipeline.verifier.score(requests)
    return [(s, f, r.step_scores[-1]) for (s, f), r in zip(kept, results, strict=True) if r.step_scores]


def summary(rows: list[tuple[dict, float, float]]) -> dict:
    full = [s["score"] for s, _, _ in rows]
    part = [p for _, _, p in rows]
    diff = [p - f for f, p in zip(full, part, strict=True)]
    judged = [(s, p) for s, _, p in rows if s["kth"] is not None]
    below = [(s, p) for s, p in judged if s["score"] < s["kth"]]
    above = [(s, p) for s, p in judged if s["score"] >= s["kth"]]
    return dict(
        steps=len(rows), fraction_written=statistics.median(f for _, f, _ in rows),
        correlation=statistics.correlation(full, part) if len(rows) > 2 else None,
        mean_diff=statistics.fmean(diff), sd_diff=statistics.pstdev(diff),
        below_kth_reads_below=sum(p < s["kth"] for s, p in below) / max(len(below), 1),
        kept_steps_read_below_kth_by_0_1=sum(p < s["kth"] - 0.1 for s, p in above) / max(len(above), 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", type=int, default=40)
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--taus", default="4,8,16,24")
    parser.add_argument("--sim", action="store_true", help="the simulator's A100 7B pair instead of the toy models")
    parser.add_argument("--partial-correlation", type=float, default=0.0, help="the simulator's (--sim)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = preset_config("beam", beam_size=args.beam_size, beam_width=4, seed=0)
    pipeline: Stack
    if args.sim:
        workload = preset("math500", "qwen2.5-7b-instruct", "qwen2.5-math-prm-7b")
        workload = replace(workload, prm=replace(workload.prm, partial_correlation=args.partial_correlation))
        pipeline = sim = Simulation(SimulationConfig(seed=0, workload=workload))
        requests = [sim.request(p, config, f"q{i}") for i, p in enumerate(sim.problems(args.problems))]
    else:
        pipeline = toy = Pipeline(PipelineConfig(generator_kv_gb=0.5, prm_kv_gb=0.5))
        requests = [toy.request(p.question, config, f"q{i}")
                    for i, p in enumerate(toy_problems("test", args.problems, seed=11))]
    steps = traces(pipeline, requests, args.beam_size)
    lengths = sorted(len(pipeline.tokenizer.encode(s["steps"][-1])) for s in steps)
    report: dict = dict(problems=args.problems, steps=len(steps),
                        step_tokens=dict(p10=lengths[len(lengths) // 10], median=lengths[len(lengths) // 2],
                                         p90=lengths[9 * len(lengths) // 10]), by_tau={}, by_fraction={})
    rows_all = []
    for tau in map(int, args.taus.split(",")):
        rows = partial_scores(pipeline, steps, tau)
        rows_all += rows
        report["by_tau"][tau] = summary(rows)
    for low, high in ((0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)):
        rows = [r for r in rows_all if low < r[1] <= high]
        if len(rows) > 2:
            report["by_fraction"][f"{low}-{high}"] = summary(rows)
    print(json.dumps(report, indent=1))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    pipeline.close()


if __name__ == "__main__":
    main()
