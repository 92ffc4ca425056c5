"""The simulator against real CPU runs of the bundled toy models (docs/simulator.md, "Validation on the CPU").

Before the simulator's paper-scale numbers are worth anything, it must predict what this machine does:
the fitted CPU profile (`specscale_lab.calibration.cpu_fit`) and a workload fitted from a recorded trace of the
bundled models drive the real search, runtime, scheduler and block manager on the virtual clock, with the
settings a real `specscale bench throughput` / `latency` run recorded in its summary.json, and the two
are put side by side, cell by cell. Three sub-commands:

    # 1. a trace of the real toy models (best-of-n: unselected samples, docs/simulator.md "Traces")
    python benchmarks/sim_validation.py trace --out results/simval/toy-trace.jsonl --problems 64
    # 2. the CPU profile and the toy workload, from `specscale bench characterize`, `specscale
    #    profile-prm` and the trace
    python benchmarks/sim_validation.py fit --characterize results/simval/characterize/summary.json \\
        --profile-prm results/simval/profile-prm.json --trace results/simval/toy-trace.jsonl --out results/simval
    # 3. simulate what the real runs measured, print and write the table (cell, real, simulated, error %)
    python benchmarks/sim_validation.py compare --throughput results/simval/throughput/summary.json \\
        --latency results/simval/latency/summary.json --hardware results/simval/cpu.json \\
        --workload results/simval/toy-workload.json --out docs/bench/sim-validation

Simulated runs take no CPU lock (their clock is virtual); run them with `nice`.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from collections import deque
from dataclasses import asdict, replace
from pathlib import Path

import torch

from specscale.cli import build_parser
from specscale.defaults import TOY_GENERATOR, TOY_PRM
from specscale.search.presets import preset_config
from specscale.sim.simulation import Simulation, SimulationConfig
from specscale.sim.workload import TOY, WorkloadParams
from specscale_lab.bench.latency import arrival_times, latency_numbers
from specscale_lab.bench.outputs import markdown_table
from specscale_lab.bench.runs import fresh_runtime, paired_seed, run_batch, toy_workload
from specscale_lab.calibration.calibrate import top_token_prob
from specscale_lab.calibration.cpu_fit import fit_cpu_profile
from specscale_lab.calibration.trace import (
    TraceHeader,
    TraceRequest,
    common_prefix_ratio,
    completed_paths,
    fit_workload,
    read_trace,
    trace_request,
    write_trace,
)

TARGET_ERROR = 0.15  # the target: every cell within +-15%
TRACE_VARIANT = "best-of-n"


# ---- 1. a trace of the real toy models --------------------------------------------------------------------
def record_trace(out: Path, problems: int, beam_size: int, variant: str, seed: int, threads: int | None) -> None:
    from specscale.pipeline import Pipeline, PipelineConfig

    if threads is not None:
        torch.set_num_threads(threads)
    pipeline = Pipeline(PipelineConfig())
    chosen = toy_workload(problems)
    runtime = pipeline.runtime(32)
    config = dict(beam_size=beam_size, beam_width=min(4, beam_size))
    requests = [pipeline.request(p.question, preset_config(variant, seed=paired_seed(seed, i), **config), f"q{i}")
                for i, p in enumerate(chosen)]
    runtime.run(requests)
    tokenizer = pipeline.tokenizer
    traces = [trace_request(r.request_id, runtime.search(r.request_id), p.question, len(r.prompt_ids), tokenizer,
                            p.answer, grade=lambda answer, gold: answer.strip("$ ") == gold)
              for r, p in zip(requests, chosen, strict=True)]
    header = TraceHeader(str(TOY_GENERATOR.name), str(TOY_PRM.name), 0.8,
                         asdict(preset_config(variant, **config)), "real",
                         f"bundled toy models, {problems} held-out toy problems, {variant}")
    write_trace(out, header, traces)
    pipeline.close()
    print(f"wrote {out}: {len(traces)} requests, {sum(len(t.steps) for t in traces)} candidates")


# ---- 2. the CPU profile and the toy workload --------------------------------------------------------------
def fit_toy_workload(trace: Path) -> WorkloadParams:
    """TOY with what the trace measures (fit_workload), the dominant-token probability fitted to the
    siblings' common prefix in their *first steps* (a best-of-n trace's siblings are whole solutions, whose
    shared share is far below a step's), and a system prompt as long as the real prompts' share beyond the
    question."""
    header, requests = read_trace(trace)
    fitted = fit_workload(requests, TOY)
    fitted = replace(fitted, step_tokens_sigma=sibling_step_sigma(requests), steps_sigma=sibling_steps_sigma(requests))
    fitted.sources["step_tokens_sigma"] = ("fitted: spread of log step lengths among siblings (same request, same "
                                           "step index), what sets how long a round waits for its slowest one")
    fitted.sources["steps_sigma"] = ("fitted: spread of log steps per solution among one request's samples (the "
                                     "levels carry the spread between problems), what sets which of a search's "
                                     "paths complete first")
    ratio = common_prefix_ratio([first_steps(r) for r in requests])
    if ratio is not None:
        width = header.search.get("beam_size", 4)
        fitted = replace(fitted, top_token_prob=top_token_prob(fitted, ratio, width))
        fitted.sources["top_token_prob"] = (f"fitted to the trace's first-step common-prefix ratio {ratio:.3f} "
                                            f"({width} siblings)")
    beyond_question = statistics.median(r.prompt_tokens - r.question_tokens for r in requests)
    system = max(int(round(beyond_question - template_tokens(fitted))), 0)
    fitted = replace(fitted, name="toy fitted", system_prompt_tokens=system)
    fitted.sources["system_prompt_tokens"] = (f"fitted: the trace's prompts hold a median {beyond_question:.0f} "
                                              "tokens beyond the question")
    return fitted


def sibling_step_sigma(requests: list[TraceRequest]) -> float:
    """The pooled within-group standard deviation of log step lengths, a group being one request's k-th
    steps. The simulated generator draws every step alike, so this, not the spread over all steps (which
    adds differences between problems and positions), is what reproduces a round's waiting."""
    groups = []
    for request in requests:
        by_index: dict[int, list[int]] = {}
        for step in request.steps:
            for k, tokens in enumerate(step.step_tokens):
                by_index.setdefault(k, []).append(tokens)
        groups += by_index.values()
    return pooled_log_sigma(groups, TOY.step_tokens_sigma)


def sibling_steps_sigma(requests: list[TraceRequest]) -> float:
    """The pooled within-request standard deviation of log steps per completed solution. The simulated
    generator draws a path's step count around its problem's level median (workload.py: the levels carry the
    spread between problems), so this is its spread: fitted over all solutions (0.48 on the toy models,
    against 0.16 within a request) it drew siblings of very different lengths, and a beam search, which stops
    at its first N completed paths, returned the short ones (12-18% fewer output tokens than the real search)."""
    groups = [[sum(len(s.step_tokens) for s in chain) for chain, _ in completed_paths([request])]
              for request in requests]
    return pooled_log_sigma(groups, TOY.steps_sigma)


def pooled_log_sigma(groups, fallback: float) -> float:
    """The pooled within-group standard deviation of the logs of positive counts (groups of one add nothing);
    `fallback` when no group has two."""
    squares, count, groups_used = 0.0, 0, 0
    for group in groups:
        if len(group) > 1:
            logs = [math.log(x) for x in group]
            mean = statistics.fmean(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            count, groups_used = count + len(logs), groups_used + 1
    return math.sqrt(squares / (count - groups_used)) if count > groups_used else fallback


def first_steps(request: TraceRequest) -> TraceRequest:
    """The request with each candidate's token ids cut to its first step."""
    steps = tuple(replace(s, token_ids=s.token_ids[: s.step_tokens[0]] if s.token_ids and s.step_tokens else None)
                  for s in request.steps)
    return replace(request, steps=steps)


def template_tokens(params: WorkloadParams) -> int:
    """Tokens a simulated prompt holds beyond its question and system prompt (chat markup, level word)."""
    sim = Simulation(SimulationConfig(hardware="cpu", generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                      workload=replace(params, system_prompt_tokens=0)))
    problem = sim.problems(1)[0]
    question = len(sim.tokenizer.encode(problem.question))
    sim.close()
    return len(problem.prompt_ids) - question


def fit(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    profile = fit_cpu_profile(args.characterize, args.profile_prm, out / "cpu.json", low_load=tuple(args.low_load))
    print(f"wrote {out / 'cpu.json'}: {json.dumps(profile.to_json(), indent=2)}")
    workload = fit_toy_workload(Path(args.trace))
    (out / "toy-workload.json").write_text(json.dumps(workload.to_json(), indent=2) + "\n")
    print(f"wrote {out / 'toy-workload.json'}: {json.dumps(workload.to_json(), indent=2)}")
    return 0


# ---- 3. the simulated side of a real run ------------------------------------------------------------------
def real_settings(summary: dict) -> argparse.Namespace:
    """The options a `specscale bench` run used, parsed back from the command it recorded."""
    words = shlex.split(summary["run"]["command"])
    return build_parser().parse_args(words[1:])


def load_workload(path: str | None) -> WorkloadParams:
    if path is None:
        return TOY
    return WorkloadParams.from_json(json.loads(Path(path).read_text()))


def simulation(hardware: str, workload: WorkloadParams, real: dict, seed: int) -> Simulation:
    """The simulated toy stack with the real run's engine settings (spare rows, LV threshold; KV pools are ample
    in both)."""
    return Simulation(SimulationConfig(hardware=hardware, generator=str(TOY_GENERATOR), prm=str(TOY_PRM),
                                       workload=workload, spare_rows=real["run"].get("spare_rows"),
                                       lv_threshold_tokens=real["run"]["lv_threshold_tokens"], seed=seed))


def simulate_throughput(hardware: str, workload: WorkloadParams, real: dict, seed: int) -> dict:
    """results[variant][beam size] of the real run's cells, simulated once (the simulation is deterministic)."""
    args = real_settings(real)
    sim = simulation(hardware, workload, real, seed)
    problems = sim.problems(args.problems)
    results: dict = {}
    for n in args.beam_sizes:
        for variant in args.variants:
            requests = [sim.request(p, preset_config(variant, seed=paired_seed(args.seed, i), beam_size=n,
                                                     beam_width=args.beam_width, max_rounds=args.max_rounds),
                                    f"{variant} {i}") for i, p in enumerate(problems)]
            runtime = fresh_runtime(sim, args.max_concurrency)
            batch = run_batch(runtime, requests)
            results.setdefault(variant, {})[str(n)] = simulated_numbers(batch, problems)
            print(f"simulated {variant} N={n}: {results[variant][str(n)]['output_tokens_per_s']:.0f} output tok/s",
                  file=sys.stderr)
    sim.close()
    return results


def simulated_numbers(batch, problems) -> dict:
    """The throughput numbers `bench/numbers.py:serving_numbers` reports, on the simulated clock."""
    metrics = batch.runtime.metrics.summary()
    usage = [r.usage for r in batch.results]
    correct = sum(r.answer is not None and r.answer == p.answer for r, p in zip(batch.results, problems, strict=True))
    elapsed = batch.elapsed_s
    return {
        "elapsed_s": elapsed, "output_tokens_per_s": sum(u.output_tokens for u in usage) / elapsed,
        "requests_per_s": len(usage) / elapsed,
        "generated_tokens_per_s": sum(u.generated_tokens for u in usage) / elapsed,
        "accuracy": correct / len(usage), "output_tokens": sum(u.output_tokens for u in usage),
        "generated_tokens": sum(u.generated_tokens for u in usage), "generation_s": metrics["generation_s"],
        "verification_s": metrics["verification_s"], "verifier_calls": metrics["verifier_calls"],
        "verifier_batch_tokens_median": metrics["verifier_batch_tokens_median"],
        "physical_to_logical": metrics["physical_to_logical"],
        "flush_reasons": dict(batch.runtime.flush_reasons),
    }


def simulate_latency(hardware: str, workload: WorkloadParams, real: dict, seed: int) -> dict:
    """results[variant][beam size]["rates"] of the real latency run, on the same arrival times (repeat 0)."""
    args = real_settings(real)
    sim = simulation(hardware, workload, real, seed)
    problems = sim.problems(args.problems)
    rates = real["rates"]
    results: dict = {}
    for n in args.beam_sizes:
        for variant in args.variants:
            points = []
            for index, rate in enumerate(rates):
                arrivals = arrival_times(len(problems), rate, args.burstiness, [args.seed, 0, index])
                requests = [sim.request(p, preset_config(variant, seed=paired_seed(args.seed, i), beam_size=n,
                                                         beam_width=args.beam_width, max_rounds=args.max_rounds),
                                        f"{variant} {rate} {i}") for i, p in enumerate(problems)]
                latencies = open_loop(sim, args.max_concurrency, requests, arrivals)
                points.append({"rate": rate, **latency_numbers(latencies)})
            results.setdefault(variant, {})[str(n)] = {"rates": points}
            print(f"simulated latency {variant} N={n}", file=sys.stderr)
    sim.close()
    return results


def open_loop(sim: Simulation, max_concurrency: int, requests, arrivals: list[float]) -> list[dict]:
    """`bench/latency.py:serve_open_loop` on the virtual clock: submit at arrival, tick in between, and move
    the clock to the next arrival when nothing runs."""
    clock = sim.clock
    finished_at: dict[str, float] = {}
    runtime = fresh_runtime(sim, max_concurrency, on_finished=lambda request_id, _: finished_at.__setitem__(request_id, clock()))
    pending, ids, start = deque(zip(arrivals, requests, strict=True)), [], clock()
    while pending or runtime.has_work():
        now = clock() - start
        while pending and pending[0][0] <= now:
            ids.append(runtime.submit(pending.popleft()[1]))
        if runtime.has_work():
            runtime.step()
        elif pending:  # idle: jump to the next arrival and submit it (now + gap may round below it)
            clock.advance(pending[0][0] - now)
            ids.append(runtime.submit(pending.popleft()[1]))
    return [{"arrival_s": arrival, "latency_s": finished_at[i] - (start + arrival),
             "output_tokens": runtime.result(i).usage.output_tokens, "queued_s": runtime.result(i).timings.queued_s}
            for i, arrival in zip(ids, arrivals, strict=True)]


RATES = ("output_tokens_per_s", "requests_per_s", "generated_tokens_per_s")
SECONDS = ("elapsed_s", "generation_s", "verification_s")


def calibrated(simulated: dict, real: dict, variant: str, beam_size: str) -> dict:
    """The simulated cells on a device `factor` times as fast, factor = real / simulated output tok/s of one
    cell: the other cells then test the simulator's *relative* predictions, when the profile was fitted on
    another machine than the real run's."""
    key = "output_tokens_per_s"
    factor = real["results"][variant][beam_size][key] / simulated[variant][beam_size][key]
    out = {}
    for name, by_size in simulated.items():
        for n, cell in by_size.items():
            scaled = {k: v * factor for k, v in cell.items() if k in RATES}
            scaled.update({k: v / factor for k, v in cell.items() if k in SECONDS})
            out.setdefault(name, {})[n] = {**cell, **scaled, "speed_factor": factor}
    return out


# ---- the table ----------------------------------------------------------------------------------------------
THROUGHPUT_CELLS = (("output tok/s", "output_tokens_per_s"), ("req/s", "requests_per_s"))
DIAGNOSTICS = (("generated tok/s", "generated_tokens_per_s"), ("output tokens", "output_tokens"),
               ("generated tokens", "generated_tokens"), ("gen s", "generation_s"), ("PRM s", "verification_s"),
               ("PRM calls", "verifier_calls"), ("PRM tokens/call", "verifier_batch_tokens_median"),
               ("phys/log", "physical_to_logical"))
LATENCY_CELLS = (("norm. ms/token", "mean_normalized_ms_per_token"), ("p50 s", "p50_s"), ("p90 s", "p90_s"))


def error(real: float, simulated: float) -> float:
    return (simulated - real) / real if real else float("inf")


def throughput_rows(real: dict, simulated: dict, cells=THROUGHPUT_CELLS) -> list[dict]:
    rows = []
    for variant, by_size in simulated.items():
        for n, cell in by_size.items():
            for title, key in cells:
                truth = real["results"][variant][n][key]
                rows.append({"cell": f"{variant} N={n} {title}", "variant": variant, "beam_size": int(n),
                             "metric": key, "real": truth, "simulated": cell[key], "error": error(truth, cell[key])})
    return rows


def latency_rows(real: dict, simulated: dict) -> list[dict]:
    rows = []
    for variant, by_size in simulated.items():
        for n, cell in by_size.items():
            truths = real["results"][variant][n]["rates"]
            for truth, point in zip(truths, cell["rates"], strict=True):
                for title, key in LATENCY_CELLS:
                    rows.append({"cell": f"{variant} N={n} {point['rate']:.2f} req/s {title}", "variant": variant,
                                 "beam_size": int(n), "metric": key, "rate": point["rate"], "real": truth[key],
                                 "simulated": point[key], "error": error(truth[key], point[key])})
    return rows


def ordering(real: dict, simulated: dict, key: str = "output_tokens_per_s") -> list[dict]:
    """Per beam size, the variants ranked by real and by simulated output tok/s, and the pairs the two
    order differently (with the real gap between them, to tell a real inversion from noise)."""
    out = []
    sizes = sorted({n for by_size in simulated.values() for n in by_size}, key=int)
    for n in sizes:
        variants = [v for v in simulated if n in simulated[v]]
        truth = {v: real["results"][v][n][key] for v in variants}
        guess = {v: simulated[v][n][key] for v in variants}
        swapped = [(a, b, abs(truth[a] - truth[b]) / max(truth[a], truth[b]))
                   for i, a in enumerate(variants) for b in variants[i + 1:]
                   if (truth[a] - truth[b]) * (guess[a] - guess[b]) < 0]
        out.append({"beam_size": int(n), "real": sorted(variants, key=truth.get, reverse=True),
                    "simulated": sorted(variants, key=guess.get, reverse=True), "swapped_pairs": swapped})
    return out


def report(throughput: list[dict], diagnostics: list[dict], latency: list[dict], orders: list[dict]) -> str:
    text = ""
    for title, rows in (("Throughput", throughput), ("Latency", latency), ("Diagnostics (not targets)", diagnostics)):
        if not rows:
            continue
        within = sum(abs(r["error"]) <= TARGET_ERROR for r in rows)
        text += f"\n## {title}: {within} of {len(rows)} cells within ±{TARGET_ERROR:.0%}\n\n"
        text += markdown_table(["cell", "real", "simulated", "error %"],
                               [[r["cell"], r["real"], r["simulated"], f"{100 * r['error']:+.1f}"] for r in rows])
    for order in orders:
        swaps = ", ".join(f"{a} / {b} (real gap {100 * gap:.1f}%)" for a, b, gap in order["swapped_pairs"]) or "none"
        text += (f"\n**Ordering at N = {order['beam_size']}**: real {' > '.join(order['real'])}; simulated "
                 f"{' > '.join(order['simulated'])}; pairs ordered differently: {swaps}.\n")
    return text


def compare(args) -> int:
    torch.set_num_threads(1)
    workload = load_workload(args.workload)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"hardware": args.hardware, "workload": workload.to_json(), "seed": args.seed}
    throughput = diagnostics = latency = orders = []
    if args.throughput:
        real = json.loads(Path(args.throughput).read_text())
        simulated = (json.loads(Path(args.reuse).read_text())["simulated_throughput"] if args.reuse
                     else simulate_throughput(args.hardware, workload, real, args.seed))
        if args.calibrate_on:
            simulated = calibrated(simulated, real, *args.calibrate_on.split())
            summary["calibrated_on"] = args.calibrate_on
        throughput, orders = throughput_rows(real, simulated), ordering(real, simulated)
        diagnostics = throughput_rows(real, simulated, DIAGNOSTICS)
        summary.update(real_throughput=args.throughput, simulated_throughput=simulated)
    if args.latency:
        real = json.loads(Path(args.latency).read_text())
        simulated = simulate_latency(args.hardware, workload, real, args.seed)
        latency = latency_rows(real, simulated)
        summary.update(real_latency=args.latency, simulated_latency=simulated)
    summary.update(throughput=throughput, latency=latency, diagnostics=diagnostics, ordering=orders)
    text = report(throughput, diagnostics, latency, orders)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "sim-validation.md").write_text(f"# Simulator validation\n\n```bash\n{shlex.join(sys.argv)}\n```\n" + text)
    print(text)
    return 0


# ---- command line -------------------------------------------------------------------------------------------
def build_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    trace = sub.add_parser("trace", help="record a trace of the real toy models")
    trace.add_argument("--out", required=True)
    trace.add_argument("--problems", type=int, default=64)
    trace.add_argument("--beam-size", type=int, default=8)
    trace.add_argument("--variant", default=TRACE_VARIANT)
    trace.add_argument("--seed", type=int, default=0)
    trace.add_argument("--threads", type=int, default=None)
    fitting = sub.add_parser("fit", help="fit the CPU profile and the toy workload")
    fitting.add_argument("--characterize", required=True, help="specscale bench characterize's summary.json")
    fitting.add_argument("--profile-prm", default=None, help="specscale profile-prm's JSON")
    fitting.add_argument("--low-load", nargs="+", default=(),
                         help="characterize summary.json files at one request in flight: the fixed costs (specscale_lab/calibration/cpu_fit.py)")
    fitting.add_argument("--trace", required=True, help="the trace `trace` recorded")
    fitting.add_argument("--out", required=True, help="folder for cpu.json and toy-workload.json")
    comparing = sub.add_parser("compare", help="simulate real runs and put them side by side")
    comparing.add_argument("--throughput", default=None, help="a real `specscale bench throughput` summary.json")
    comparing.add_argument("--latency", default=None, help="a real `specscale bench latency` summary.json")
    comparing.add_argument("--hardware", default="cpu", help="hardware profile: bundled name or JSON path")
    comparing.add_argument("--workload", default=None, help="WorkloadParams JSON (default: the TOY preset)")
    comparing.add_argument("--seed", type=int, default=0, help="the simulation's seed (problems, draws)")
    comparing.add_argument("--reuse", default=None, help="an earlier compare's summary.json: its simulated cells")
    comparing.add_argument("--calibrate-on", default=None, help="'VARIANT N': scale simulated speed to this cell")
    comparing.add_argument("--out", required=True)
    return parser


def main(argv=None) -> int:
    args = build_argument_parser().parse_args(argv)
    if args.command == "trace":
        record_trace(Path(args.out), args.problems, args.beam_size, args.variant, args.seed, args.threads)
        return 0
    return fit(args) if args.command == "fit" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
