"""ScriptedVerifier: a deterministic `VerifierBackend` (runtime/backend.py) on a virtual clock, for exact
tests of the search logic: step j's score is a fixed function of (question, steps 1..j), and a call
advances the clock by `prm_cost`."""

from __future__ import annotations

from collections.abc import Sequence

from scripted_generator import stable_hash
from specscale.seam import KVUsage, ScoreRequest, ScoreResult
from specscale.sim.clock import VirtualClock


def hashed_score(question: str, steps: tuple[str, ...], perfect_rate: float = 0.0,
                 score_levels: int = 10_000) -> float:
    """A fixed score in [0, 1): one of `score_levels` values (few levels: many ties), or exactly 1.0 at
    `perfect_rate`."""
    h = stable_hash(question, steps)
    if (h % 1000) / 1000 < perfect_rate:
        return 1.0
    return ((h >> 10) % score_levels) / score_levels


class ScriptedVerifier:
    """perfect_rate: the share of steps scored exactly 1.0; score_levels: how many distinct scores below
    1.0 there are. It holds no KV (`num_blocks` in total)."""

    def __init__(self, clock: VirtualClock, prm_cost: float = 0.5, perfect_rate: float = 0.0, num_blocks: int = 10,
                 score_levels: int = 10_000):
        self.clock, self.prm_cost, self.perfect_rate, self.num_blocks = clock, prm_cost, perfect_rate, num_blocks
        self.score_levels = score_levels
        self.batches: list[int] = []

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        self.batches.append(len(requests))
        self.clock.advance(self.prm_cost)
        results = []
        for r in requests:
            steps = tuple(s for s in r.steps if s.strip())
            scores = tuple(hashed_score(r.question, steps[: j + 1], self.perfect_rate, self.score_levels)
                           for j in range(len(steps)))
            results.append(ScoreResult(scores, len(steps)))
        return results

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        return len(request.steps[-1]) + 1

    @property
    def kv_usage(self) -> KVUsage:
        return KVUsage(0, self.num_blocks)
