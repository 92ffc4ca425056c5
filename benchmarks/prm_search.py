"""The search points of prm_throughput.py: a beam search's verification traffic, scored round by round.

A point "8x6" is 8 paths scored in each of 6 rounds. Round 0 scores 8 one-step paths of one question; every
later round keeps the first 8 / 4 paths (a beam search keeps the best N / M; which ones does not change the
work) and extends each with 4 new steps, so every round asks for 8 whole paths (question + steps so far) to be
scored, siblings sharing their parent's steps. Text is word-level over the random checkpoint's vocabulary
("t123 t456 ...", one token per word), the question 128 words and a step 64, so both engines score the very
token ids our PRM format (verify/formats.py) renders. Every repeat uses a fresh question.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from specscale.config import EngineConfig
from specscale.seam import ScoreRequest
from specscale.verify.prm import PRM_MAX_BATCHED_TOKENS, PRM_MAX_SEQS, Verifier, VerifierConfig

BEAM_WIDTH = 4  # M: children per kept path
QUESTION_WORDS, STEP_WORDS = 128, 64


@dataclass(frozen=True)
class SearchPoint:
    paths: int
    rounds: int

    @property
    def label(self) -> str:
        return f"search {self.paths}x{self.rounds}"


def parse_search(text: str) -> SearchPoint:
    """ "8x6" -> SearchPoint(paths=8, rounds=6); paths a multiple of the beam width 4."""
    paths, _, rounds = text.lower().partition("x")
    if not (paths.isdigit() and rounds.isdigit() and int(rounds) > 0 and int(paths) % BEAM_WIDTH == 0 and int(paths)):
        raise argparse.ArgumentTypeError(f"a search is PATHSxROUNDS with PATHS a multiple of {BEAM_WIDTH}; got {text!r}")
    return SearchPoint(int(paths), int(rounds))


def search_rounds(point: SearchPoint, vocab: int, seed: int) -> list[list[ScoreRequest]]:
    """Per round, the paths the search asks to score (see the module docstring)."""
    generator = torch.Generator().manual_seed(seed)

    def words(count: int) -> str:
        return " ".join(f"t{i}" for i in torch.randint(10, vocab, (count,), generator=generator).tolist())

    question, paths, rounds = words(QUESTION_WORDS), [()], []
    for _ in range(point.rounds):
        kept = paths[: max(1, point.paths // BEAM_WIDTH)]
        children = point.paths // len(kept)
        paths = [parent + (words(STEP_WORDS),) for parent in kept for _ in range(children)]
        rounds.append([ScoreRequest(question, steps) for steps in paths])
    return rounds


def build_verifier(model: str, dtype: str, kv_gb: float, kernels: str = "auto") -> Verifier:
    """The verifier as the pipeline builds it (specscale/pipeline.py, build_verifier)."""
    return Verifier(VerifierConfig(EngineConfig(model=model, dtype=dtype, kv_cache_memory_gb=kv_gb,
                                                max_num_batched_tokens=PRM_MAX_BATCHED_TOKENS, max_num_seqs=PRM_MAX_SEQS,
                                                kernels=kernels)))


def score_search(verifier: Verifier, rounds: list[list[ScoreRequest]]) -> tuple[float, list[list[float]], int]:
    """Seconds to score every round in order, the step scores of every scored path, PRM tokens computed."""
    verifier.clear()
    computed = verifier.stats.computed_tokens
    start = time.perf_counter()
    results = [result for requests in rounds for result in verifier.score(requests)]
    elapsed = time.perf_counter() - start
    bad = [result.error for result in results if not result.ok]
    if bad:
        raise RuntimeError(f"the verifier could not score a path: {bad[0]}")
    return elapsed, [list(result.step_scores) for result in results], verifier.stats.computed_tokens - computed


def search_ids(prm_format, rounds: list[list[ScoreRequest]]) -> list[list[list[int]]]:
    """The token ids of every round's inputs as our PRM format renders them (what vLLM-CPU is given)."""
    return [[list(prm_format.encode(r.question, r.steps).token_ids) for r in requests] for requests in rounds]


def run_searches(verifier: Verifier, runs: dict[str, list[list[list[ScoreRequest]]]], tokens: dict[str, list[int]]) -> dict:
    """runs: label -> the rounds of every run (a warm-up, then one per repeat); tokens: label -> input tokens of
    each run. -> run_ours' layout plus "computed": the PRM tokens our verifier ran in the last repeat."""
    seconds, scores, computed = {}, {}, {}
    for label_runs in runs.values():
        score_search(verifier, label_runs[0])  # warm-up
    repeats = len(next(iter(runs.values()))) - 1
    for repeat in range(1, repeats + 1):
        for label, label_runs in runs.items():
            elapsed, scores[label], computed[label] = score_search(verifier, label_runs[repeat])
            seconds.setdefault(label, []).append(elapsed)
            print(f"repeat {repeat - 1} specscale {label}: {tokens[label][repeat] / elapsed:,.0f} tokens/s "
                  f"({computed[label]:,} of {tokens[label][repeat]:,} computed)", flush=True)
    return {"seconds": seconds, "scores": scores, "computed": computed}
