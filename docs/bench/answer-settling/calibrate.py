"""How fast answers settle across rounds, measured from traces (docs/simulator.md, "Answer settling"; issue 46).

Reads `specscale trace` files (JSONL; real or `--backend sim`) of beam-style searches scored with the `last`
aggregation (a candidate's score is its last step's) and prints, per trace, what the early-exit policies read
(`search/early_exit.py`):

- rounds: rounds per search; first completed: the round of a search's first completed path;
- leads first / settled: the round (as a share of the search's rounds, round r counting (r + 1) / rounds) at
  which the final answer first leads the completed paths (best score, then the lower id), and from which it
  leads to the end;
- soft holds: the share of decided rounds with a completed path where the best completed path scores above
  every retained running path (what `certain` reads, threshold aside); soft fires: the share of searches
  where it holds before the last round, and soft same answer: of those, the share whose leader then has the
  final answer;
- best running by round: the mean score of the best retained running path in round r (what `stall` reads)
  and rises: the share of decided rounds after the first where it rose above the best of the earlier rounds;
- step score by step: the mean score of non-final steps of correct paths by step index, and the least-squares
  slope of their logits (below 1.0) on the step index (a drift: the simulator's `step_drift`, seen through
  selection);
- consecutive r: the within-class correlation of consecutive step scores' logits: the pairs (step j, step
  j + 1) of correct completed paths, both non-final and below 1.0, each pair of candidates once (`raw`), and
  after subtracting each step index's mean (`centred`, which removes a drift). Correct paths are sound at
  every step, so this is the correlation the simulator's `step_persistence` sets, seen through selection
  (beam keeps the better-scored paths): compare traces through the same statistic, not with rho itself;
- parent-child r: the correlation of a retained running path's logit with each of its children's (every
  child, unselected; both classes).

    python docs/bench/answer-settling/calibrate.py /tmp/settle/toy-beam8.jsonl /tmp/settle/sim-toy-beam8.jsonl
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict

from specscale_lab.calibration.trace import TraceRequest, TraceStep, completed_paths, read_trace

ROUNDS_SHOWN = 8


def score(step: TraceStep) -> float | None:
    return step.scores[-1] if step.scores else None


def logit(s: float) -> float:
    return math.log(s / (1 - s))


def search_rounds(request: TraceRequest) -> dict:
    """Per round of one search: the best retained running score, the leader among the completed paths so far
    (score, -id, answer) and whether it scores above every retained running path."""
    rounds = 1 + max(s.round for s in request.steps)
    parents = {s.parent for s in request.steps if s.parent is not None}
    pool: list[TraceStep] = []
    best_running, leaders, soft = [], [], []
    for r in range(rounds):
        here = [s for s in request.steps if s.round == r and score(s) is not None]
        pool += [s for s in here if s.completed]
        retained = [score(s) for s in here if not s.completed and s.id in parents]
        best_running.append(max(retained) if retained else None)
        leader = max(pool, key=lambda s: (score(s), -s.id)) if pool else None
        leaders.append(leader.answer if leader is not None else None)
        if leader is not None and retained:
            soft.append((r, score(leader) > max(retained), leader.answer))
    return dict(rounds=rounds, best_running=best_running, leaders=leaders, soft=soft)


def settling(requests: list[TraceRequest]) -> dict:
    per = [search_rounds(r) for r in requests]
    rounds = [p["rounds"] for p in per]
    first_completed, leads_first, settled = [], [], []
    soft_rounds, soft_fires, soft_same = [], 0, []
    by_round: dict[int, list[float]] = defaultdict(list)
    rises = []
    for p in per:
        final = p["leaders"][-1]
        n = p["rounds"]
        completed_at = [r for r, a in enumerate(p["leaders"]) if a is not None]
        if completed_at:
            first_completed.append(completed_at[0])
        if final is not None:
            leads_first.append((next(r for r, a in enumerate(p["leaders"]) if a == final) + 1) / n)
            last_other = max((r for r, a in enumerate(p["leaders"]) if a != final), default=-1)
            settled.append((last_other + 2) / n)
        soft_rounds += [holds for _, holds, _ in p["soft"]]
        fired = [(r, answer) for r, holds, answer in p["soft"] if holds and r < n - 1]
        if fired:
            soft_fires += 1
            soft_same.append(fired[0][1] == final)
        best = None
        for r, value in enumerate(p["best_running"]):
            if value is None:
                continue
            by_round[r].append(value)
            if best is not None:
                rises.append(value > best)
            best = value if best is None else max(best, value)
    return dict(
        searches=len(per), rounds=statistics.fmean(rounds), first_completed=statistics.fmean(first_completed),
        leads_first=statistics.fmean(leads_first), settled=statistics.fmean(settled),
        soft_holds=statistics.fmean(soft_rounds) if soft_rounds else float("nan"),
        soft_fires=soft_fires / len(per), soft_same=statistics.fmean(soft_same) if soft_same else float("nan"),
        best_running={r: (statistics.fmean(v), len(v)) for r, v in sorted(by_round.items())},
        rises=statistics.fmean(rises) if rises else float("nan"),
    )


def step_pairs(requests: list[TraceRequest]) -> tuple[dict[int, list[float]], list[tuple[int, float, float]]]:
    """Non-final step scores of correct paths by step index, and each pair of consecutive ones once:
    (index of the first, its score, the next one's)."""
    by_index: dict[int, dict[tuple, float]] = defaultdict(dict)
    pairs: dict[tuple, tuple[int, float, float]] = {}
    for request in requests:
        for chain, correct in completed_paths([request]):
            if correct:
                _pairs(request.request_id, chain, by_index, pairs)
    return {j: list(v.values()) for j, v in by_index.items()}, list(pairs.values())


def _pairs(request_id: str, chain: list[TraceStep], by_index: dict[int, dict[tuple, float]],
           pairs: dict[tuple, tuple[int, float, float]]) -> None:
    scored = [((request_id, s.id, k), v) for s in chain for k, v in enumerate(s.scores)][:-1]  # final dropped
    for j, (where, value) in enumerate(scored):
        by_index[j][where] = value
        if j + 1 < len(scored):
            pairs[(where, scored[j + 1][0])] = (j, value, scored[j + 1][1])


def correlations(requests: list[TraceRequest]) -> dict:
    by_index, pairs = step_pairs(requests)
    inner = [(j, logit(a), logit(b)) for j, a, b in pairs if 0 < a < 1 and 0 < b < 1]
    means = {j: statistics.fmean(logit(v) for v in values if 0 < v < 1) for j, values in by_index.items()
             if any(0 < v < 1 for v in values)}
    raw = statistics.correlation([a for _, a, _ in inner], [b for _, _, b in inner]) if len(inner) > 2 else None
    centred = statistics.correlation([a - means[j] for j, a, _ in inner], [b - means[j + 1] for j, _, b in inner]) \
        if len(inner) > 2 else None
    family = []
    for request in requests:
        by_id = {s.id: s for s in request.steps}
        parents = {s.parent for s in request.steps if s.parent is not None}
        for s in request.steps:
            parent = by_id.get(s.parent) if s.parent is not None else None
            if parent is None or parent.completed or parent.id not in parents or not s.scores or not parent.scores:
                continue
            a, b = parent.scores[-1], s.scores[0]
            if 0 < a < 1 and 0 < b < 1:
                family.append((logit(a), logit(b)))
    points = [(j, logit(v)) for j, values in by_index.items() for v in values if 0 < v < 1]
    return dict(
        pairs=len(inner), raw=raw, centred=centred,
        drift=statistics.linear_regression(*zip(*points, strict=True)).slope if len(points) > 2 else None,
        parent_child=statistics.correlation(*zip(*family, strict=True)) if len(family) > 2 else None,
        parent_child_pairs=len(family),
        step_means={j: (statistics.fmean(v), len(v)) for j, v in sorted(by_index.items())},
    )


def report(path: str) -> dict:
    header, requests = read_trace(path)
    return dict(path=path, source=header.source, generator=header.generator, prm=header.prm,
                accuracy=statistics.fmean(bool(r.correct) for r in requests),
                **settling(requests), **correlations(requests))


def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def table(reports: list[dict]) -> str:
    names = [f"`{r['path'].rsplit('/', 1)[-1]}`" for r in reports]
    rows = [
        ("searches", [str(r["searches"]) for r in reports]),
        ("accuracy (best path)", [f"{100 * r['accuracy']:.1f}%" for r in reports]),
        ("rounds per search", [fmt(r["rounds"]) for r in reports]),
        ("first completed path, round", [fmt(r["first_completed"]) for r in reports]),
        ("final answer leads first, share of rounds", [fmt(r["leads_first"]) for r in reports]),
        ("final answer leads from, share of rounds", [fmt(r["settled"]) for r in reports]),
        ("soft condition holds, share of rounds with a completed path", [fmt(r["soft_holds"]) for r in reports]),
        ("soft condition holds before the last round, share of searches", [fmt(r["soft_fires"]) for r in reports]),
        ("... and its leader has the final answer", [fmt(r["soft_same"]) for r in reports]),
        ("best running path rises, share of later rounds", [fmt(r["rises"]) for r in reports]),
        ("consecutive step logits r (correct paths, raw)", [fmt(r["raw"]) for r in reports]),
        ("... centred by step index", [fmt(r["centred"]) for r in reports]),
        ("... pairs", [str(r["pairs"]) for r in reports]),
        ("parent-child logits r (retained parent, every child)", [fmt(r["parent_child"]) for r in reports]),
        ("logit slope per step index (correct paths, non-final)", [fmt(r["drift"]) for r in reports]),
    ]
    for k in range(ROUNDS_SHOWN):
        rows.append((f"best running score, round {k} (searches)", [
            f"{r['best_running'][k][0]:.2f} ({r['best_running'][k][1]})" if k in r["best_running"] else "–"
            for r in reports]))
    for k in range(ROUNDS_SHOWN - 2):
        rows.append((f"step {k} score, correct paths, non-final", [
            f"{r['step_means'][k][0]:.2f}" if k in r["step_means"] else "–" for r in reports]))
    lines = ["| statistic | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(reports)]
    lines += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="trace files (JSONL, `specscale trace`)")
    args = parser.parse_args()
    print(table([report(path) for path in args.traces]))


if __name__ == "__main__":
    main()
