"""Instrumented stand-ins for the generator and the verifier backends (`bench characterize`): the same
protocols as `runtime/backend.py`, every generator iteration and PRM call timed on a clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from specscale.runtime.backend import GeneratorBackend, VerifierBackend
from specscale.seam import KVUsage, ScoreRequest, ScoreResult, SequenceOp, SequenceUpdate


class TimedGenerator:
    """A generator backend with every iteration timed on `clock`: (sequences advanced, seconds) per step(),
    and the sequences the backend held as each step began (live_sequences)."""

    def __init__(self, backend: GeneratorBackend, clock: Callable[[], float] = time.perf_counter):
        self._backend, self._clock = backend, clock
        self.iterations: list[tuple[int, float]] = []
        self.live_sequences: list[int] = []

    def apply(self, ops: Sequence[SequenceOp]) -> None:
        self._backend.apply(ops)

    def step(self) -> list[SequenceUpdate]:
        self.live_sequences.append(self._backend.num_live_sequences)
        start = self._clock()
        updates = self._backend.step()
        self.iterations.append((len(updates), self._clock() - start))
        return updates

    def has_work(self) -> bool:
        return self._backend.has_work()

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._backend.decode(token_ids)

    @property
    def num_live_sequences(self) -> int:
        return self._backend.num_live_sequences

    @property
    def kv_usage(self) -> KVUsage:
        return self._backend.kv_usage


class TimedVerifier:
    """A verifier backend with every PRM call timed (paths, computed tokens, seconds) and the time spent
    sizing queued steps (`tokens_to_compute`) summed, on `clock`."""

    def __init__(self, backend: VerifierBackend, clock: Callable[[], float] = time.perf_counter):
        self._backend, self._clock = backend, clock
        self.calls: list[tuple[int, int, float]] = []
        self.sizing_s = 0.0

    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        start = self._clock()
        results = self._backend.score(requests)
        tokens = sum(r.computed_tokens for r in results)
        self.calls.append((len(requests), tokens, self._clock() - start))
        return results

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        start = self._clock()
        tokens = self._backend.tokens_to_compute(request)
        self.sizing_s += self._clock() - start
        return tokens

    @property
    def kv_usage(self) -> KVUsage:
        return self._backend.kv_usage
