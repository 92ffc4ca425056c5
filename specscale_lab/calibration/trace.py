"""Traces: what a real (or simulated) search run records, and the workload parameters fitted from it.

A trace is a JSONL file (docs/simulator.md has the full schema). Line 1 is a header; each further line is
one request with every candidate step its search produced:

    {"format": "specscale-trace", "version": 1, "generator": ..., "prm": ..., "temperature": 0.8, ...}
    {"request_id": ..., "question": ..., "question_tokens": 41, "prompt_tokens": 230, "gold": "12",
     "answer": "12", "correct": true,
     "steps": [{"id": 0, "parent": null, "round": 0, "step_tokens": [57], "token_ids": [...] | null,
                "scores": [0.93], "multiplicity": 1, "completed": false, "answer": null, "correct": null}, ...]}

A candidate usually holds one step; the last round's (and best-of-N's) hold every step up to EOS, hence
`step_tokens` and `scores` are lists (one entry per "\\n\\n"-delimited step; `scores` may be shorter when
the candidate was never, or not fully, scored). `token_ids` are optional: they are what sibling
common-prefix ratios are measured from.

`fit_workload` turns a trace into `WorkloadParams`: step lengths, steps per solution, question lengths
and accuracy from the completed paths, PRM scores of sound steps (every step of a correct path) against
erred ones (the last step of a wrong path), and optionally the dominant-token probability from the
siblings' common prefixes. Record fitting traces with `best-of-n`: its samples are unselected, where beam
search keeps the better-scored paths and so biases the accuracy and score statistics upwards.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from specscale.grading import extract_answer
from specscale.prompts import STEP_SEPARATOR
from specscale.sim.workload import PRMScoreParams, WorkloadParams
from specscale_lab.calibration.calibrate import top_token_prob

FORMAT = "specscale-trace"
VERSION = 1


@dataclass(frozen=True)
class TraceHeader:
    generator: str
    prm: str
    temperature: float
    search: dict = field(default_factory=dict)  # the SearchConfig fields the run used
    source: str = "real"  # "real" or "simulated"
    notes: str = ""


@dataclass(frozen=True)
class TraceStep:
    """One candidate of a search: parent is the candidate it extends (None for a child of the prompt)."""

    id: int
    parent: int | None
    round: int
    step_tokens: tuple[int, ...]
    scores: tuple[float, ...]
    multiplicity: int = 1
    completed: bool = False
    answer: str | None = None
    correct: bool | None = None
    token_ids: tuple[int, ...] | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.step_tokens)


@dataclass(frozen=True)
class TraceRequest:
    request_id: str
    question: str
    question_tokens: int
    prompt_tokens: int
    gold: str | None
    answer: str | None
    correct: bool | None
    steps: tuple[TraceStep, ...]


# ---- files ------------------------------------------------------------------------------------------------
def write_trace(path: str | Path, header: TraceHeader, requests: list[TraceRequest]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        out.write(json.dumps({"format": FORMAT, "version": VERSION, **asdict(header)}) + "\n")
        for request in requests:
            out.write(json.dumps(asdict(request)) + "\n")


def read_trace(path: str | Path) -> tuple[TraceHeader, list[TraceRequest]]:
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise ValueError(f"{path}: empty trace")
    header = json.loads(lines[0])
    if header.pop("format", None) != FORMAT:
        raise ValueError(f"{path}: line 1 is not a {FORMAT} header")
    version = header.pop("version", None)
    if version != VERSION:
        raise ValueError(f"{path}: trace version {version} is not supported (this SpecScale reads {VERSION})")
    requests = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            requests.append(_request_from_json(json.loads(line)))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{path}:{number}: not a trace request ({error})") from error
    return TraceHeader(**header), requests


def _request_from_json(data: dict) -> TraceRequest:
    steps = tuple(TraceStep(**{**s, "step_tokens": tuple(s["step_tokens"]), "scores": tuple(s["scores"]),
                               "token_ids": None if s.get("token_ids") is None else tuple(s["token_ids"])})
                  for s in data.pop("steps"))
    return TraceRequest(**data, steps=steps)


# ---- recording a finished search --------------------------------------------------------------------------
def trace_request(request_id: str, search, question: str, prompt_tokens: int, tokenizer, gold: str | None,
                  grade=None, keep_token_ids: bool = True) -> TraceRequest:
    """The trace of one finished `Search` (its rounds' candidates). tokenizer: the generator's (token counts
    and ids are re-encoded from the step texts); grade(answer, gold) -> bool, exact match by default."""
    grade = grade or (lambda answer, expected: answer == expected)
    steps = []
    for rd in search.rounds:
        for candidate in rd.candidates:
            pieces = split_steps(candidate.text)
            answer = extract_answer("".join(candidate.steps())) if candidate.completed else None
            correct = None if gold is None or not candidate.completed else bool(answer and grade(answer, gold))
            steps.append(TraceStep(
                id=candidate.id, parent=None if candidate.parent is None else candidate.parent.id, round=rd.index,
                step_tokens=tuple(len(tokenizer.encode(p)) for p in pieces),
                scores=tuple(candidate.step_scores[-len(pieces):]) if candidate.step_scores else (),
                multiplicity=candidate.multiplicity, completed=candidate.completed, answer=answer, correct=correct,
                token_ids=tuple(tokenizer.encode(candidate.text)) if keep_token_ids else None,
            ))
    result = search.result
    answer = result.answer if result is not None else None
    correct = None if gold is None else bool(answer and grade(answer, gold))
    return TraceRequest(request_id, question, len(tokenizer.encode(question)), prompt_tokens, gold, answer, correct,
                        tuple(steps))


def split_steps(text: str) -> list[str]:
    """A candidate's text cut after each step delimiter; the last piece may end at EOS instead."""
    pieces = [piece + STEP_SEPARATOR for piece in text.split(STEP_SEPARATOR)]
    pieces[-1] = pieces[-1][: -len(STEP_SEPARATOR)]
    return [piece for piece in pieces if piece.strip()]


# ---- fitting ----------------------------------------------------------------------------------------------
def fit_workload(requests: list[TraceRequest], base: WorkloadParams, fit_entropy: bool = False,
                 width: int = 4) -> WorkloadParams:
    """base with every parameter the trace measures replaced (see the module docstring); fit_entropy also
    fits top_token_prob to the siblings' common-prefix ratio (Monte Carlo, about a minute)."""
    paths = completed_paths(requests)
    if not paths:
        raise ValueError("the trace has no completed path to fit from")
    step_lengths = [n for r in requests for s in r.steps for n in s.step_tokens]
    steps_per_path = [sum(len(s.step_tokens) for s in chain) for chain, _ in paths]
    graded = [correct for _, correct in paths if correct is not None]
    fitted = replace(
        base, name=f"{base.name} fitted",
        step_tokens_median=lognormal_median(step_lengths), step_tokens_sigma=lognormal_sigma(step_lengths),
        steps_median=lognormal_median(steps_per_path), steps_sigma=lognormal_sigma(steps_per_path),
        question_tokens_median=lognormal_median([r.question_tokens for r in requests]),
        question_tokens_sigma=lognormal_sigma([r.question_tokens for r in requests]),
        accuracy=min(max(sum(graded) / len(graded), 0.01), 0.99) if graded else base.accuracy,
        prm=fit_prm(paths, base.prm),
        sources={**base.sources, **{name: f"fitted from a trace of {len(requests)} requests" for name in (
            "step_tokens_median", "step_tokens_sigma", "steps_median", "steps_sigma", "question_tokens_median",
            "accuracy", "prm")}},
    )
    if fit_entropy:
        ratio = common_prefix_ratio(requests)
        if ratio is not None:
            fitted = replace(fitted, top_token_prob=top_token_prob(fitted, ratio, width))
            fitted.sources["top_token_prob"] = f"fitted to the trace's sibling common-prefix ratio {ratio:.3f}"
    return fitted


def completed_paths(requests: list[TraceRequest]) -> list[tuple[list[TraceStep], bool | None]]:
    """Every completed candidate's chain of steps (root first) and whether its answer was right."""
    out = []
    for request in requests:
        by_id = {s.id: s for s in request.steps}
        for step in request.steps:
            if step.completed:
                chain, node = [], step
                while node is not None:
                    chain.append(node)
                    node = by_id.get(node.parent) if node.parent is not None else None
                out.append((chain[::-1], step.correct))
    return out


def fit_prm(paths: list[tuple[list[TraceStep], bool | None]], base: PRMScoreParams) -> PRMScoreParams:
    """Sound steps: every step of a correct path; erred: the last step of a wrong one. Exact-1.0 shares and
    the continuous part's logit mean and spread are measured; the observed AUC is split between detection
    and separation keeping base.detection (a trace of final scores cannot tell the two apart)."""
    sound = [score for chain, correct in paths if correct for s in chain for score in s.scores]
    erred = [chain[-1].scores[-1] for chain, correct in paths if correct is False and chain[-1].scores]
    if len(sound) < 2 or len(erred) < 2:
        return base
    sound_logits, erred_logits = logits_below_one(sound), logits_below_one(erred)
    if len(sound_logits) < 2 or len(erred_logits) < 2:
        return replace(base, perfect_share_sound=perfect_share(sound), perfect_share_erred=perfect_share(erred))
    observed = mann_whitney_auc(sound_logits, erred_logits)
    separation = (observed - 0.5 * (1 - base.detection)) / base.detection if base.detection else observed
    return replace(
        base, perfect_share_sound=perfect_share(sound), perfect_share_erred=perfect_share(erred),
        sound_logit_mean=statistics.fmean(sound_logits),
        logit_spread=max(statistics.pstdev(sound_logits + erred_logits), 0.05),
        auc=min(max(separation, 0.51), 0.99),
    )


def common_prefix_ratio(requests: list[TraceRequest]) -> float | None:
    """1 - trie nodes / tokens over sibling groups (same parent, same round) whose token ids were recorded."""
    saved = total = 0
    for request in requests:
        groups: dict[tuple, list[tuple[int, ...]]] = defaultdict(list)
        for step in request.steps:
            if step.token_ids is not None:
                groups[(step.round, step.parent)] += [step.token_ids] * step.multiplicity
        for group in groups.values():
            if len(group) > 1:
                nodes = {tokens[: i + 1] for tokens in group for i in range(len(tokens))}
                total += sum(len(tokens) for tokens in group)
                saved += sum(len(tokens) for tokens in group) - len(nodes)
    return saved / total if total else None


def perfect_share(scores: list[float]) -> float:
    return min(sum(s == 1.0 for s in scores) / len(scores), 0.99)


def logits_below_one(scores: list[float]) -> list[float]:
    return [math.log(s / (1 - s)) for s in scores if 0.0 < s < 1.0]


def mann_whitney_auc(high: list[float], low: list[float]) -> float:
    """P(a draw from high > a draw from low), ties counting half."""
    ordered = sorted([(v, 1) for v in high] + [(v, 0) for v in low])
    rank_sum, i = 0.0, 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j][0] == ordered[i][0]:
            j += 1
        mean_rank = (i + j + 1) / 2  # 1-based ranks i+1..j share their mean
        rank_sum += mean_rank * sum(flag for _, flag in ordered[i:j])
        i = j
    n_high, n_low = len(high), len(low)
    return (rank_sum - n_high * (n_high + 1) / 2) / (n_high * n_low)


def lognormal_median(values: Sequence[float]) -> float:
    positive = [v for v in values if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in positive)) if positive else 1.0


def lognormal_sigma(values: Sequence[float]) -> float:
    logs = [math.log(v) for v in values if v > 0]
    return max(statistics.pstdev(logs), 0.01) if len(logs) > 1 else 0.01
