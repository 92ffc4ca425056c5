"""The backend seam: what a `SearchRuntime` drives, as typed protocols (the values that cross it are
`specscale/seam/`'s).

A *generator backend* holds sequences (token rows with their KV) and advances them one iteration at a
time; a *verifier backend* scores paths with a PRM. The runtime touches a backend through these
protocols only, never through an engine's objects, so the same runtime serves on:

- `engine/generator_backend.py` `EngineBackend` over `engine/engine.py` `Engine` (a checkpoint, or the
  simulator's `SimulatedRunner`: docs/simulator.md) and `verify/prm.py` `Verifier`;
- `tests/scripted_generator.py` / `tests/scripted_verifier.py`: scripted backends for exact tests;
- a remote backend, which only has to carry these operations and outputs: `scaleout/remote_verifier.py`
  `RemoteVerifier` scores through a PRM deployment on Ray Serve (docs/scale-out.md, disaggregated serving).

Batching. Per tick the runtime hands the generator one batch of operations (`apply`), then asks for one
iteration (`step`) and gets `SequenceUpdate`s keyed by sequence id (`seam/operations.py`, `seam/updates.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specscale.seam import KVUsage, ScoreRequest, ScoreResult, SequenceOp, SequenceUpdate
from specscale.verify.formats import PRMFormat


# ---- the protocols --------------------------------------------------------------------------------
class GeneratorBackend(Protocol):
    def apply(self, ops: Sequence[SequenceOp]) -> None:
        """Carry out the operations, in order."""

    def step(self) -> list[SequenceUpdate]:
        """One iteration over the generating sequences."""

    def has_work(self) -> bool:
        """Some sequence would advance in a `step`."""

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of generated tokens."""

    @property
    def num_live_sequences(self) -> int:
        """Sequences that hold (or wait for) KV: every one not finished, lost or aborted."""

    @property
    def kv_usage(self) -> KVUsage:
        """The generator's KV blocks in use."""


class VerifierBackend(Protocol):
    def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        """Every path's step scores, in request order (one PRM batch)."""

    def tokens_to_compute(self, request: ScoreRequest) -> int:
        """PRM tokens scoring this path would run now (the lazy-verification trigger's unit)."""

    @property
    def kv_usage(self) -> KVUsage:
        """The PRM's KV blocks in use (cached step prefixes included)."""

    @property
    def format(self) -> PRMFormat:
        """How the PRM reads a question and its steps (the server checks a question fits with it)."""

    @property
    def max_input_tokens(self) -> int:
        """The PRM's context: the longest PRM input a path may have."""

    def close(self) -> None:
        """Release what the verifier holds (its engine, or its connection to a remote one)."""
