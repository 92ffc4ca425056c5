"""The backend seam: what a `SearchRuntime` drives, as typed protocols.

A *generator backend* holds sequences (token rows with their KV) and advances them one iteration at a
time; a *verifier backend* scores paths with a PRM. The runtime touches a backend through these
protocols only, never through an engine's objects, so the same runtime serves on:

- `search/engine_backend.py` `EngineBackend` over `engine/engine.py` `Engine` (a checkpoint, or the
  simulator's `SimulatedRunner`: docs/simulator.md) and `verify/prm.py` `Verifier`;
- `tests/scripted_generator.py` / `tests/scripted_verifier.py`: scripted backends for exact tests;
- a remote backend, which only has to carry these operations and outputs: `scaleout/remote_verifier.py`
  `RemoteVerifier` scores through a PRM deployment on Ray Serve (docs/scale-out.md, disaggregated serving).

Naming. The runtime names every sequence (`SequenceId`, unique for the backend's life). A sequence of
multiplicity m (computation deduplication) may split into at most m rows before its segment ends, as
its m copies draw different tokens; the operation that starts it reserves the m - 1 ids its split-off
rows take (`split_ids`, used in order by the whole family), so a split needs no round trip to be named.

Lanes. A seeded sequence of multiplicity m is started with one seed per logical copy (`lane_seeds`); copy
j is *lane* j and samples only from its own seed, and every update names the lanes its row holds
(`lane_ids`), so a split row tells which logical children it carries (docs/design.md, "CD lanes", "Seeds").

Batching. Per tick the runtime hands the generator one batch of operations (`apply`), then asks for one
iteration (`step`) and gets `SequenceUpdate`s keyed by sequence id; operations on a sequence that
has already ended (it finished in the iteration whose updates the runtime is still reading) are ignored.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Union

# The seam's value types. They are defined beside the code that fills them (the engine's block manager and
# sampler, the verifier) because the engine and the verifier must not import search/ (no package cycles:
# tests/test_imports.py); everything on the other side of the seam (scaleout/, sim/, search/) takes them
# from here.
from specscale.engine.block_manager import KVUsage
from specscale.engine.sequence import SamplingParams
from specscale.verify.formats import PRMFormat
from specscale.verify.prm import ScoreRequest, ScoreResult

__all__ = [
    "AbortSequence", "BranchSequence", "EndReason", "GeneratorBackend", "KVUsage", "PauseSequence",
    "PrioritizeSequence", "SamplingParams", "ScoreRequest", "ScoreResult", "SequenceId", "SequenceOp",
    "SequenceState", "SequenceUpdate", "StartSequence", "VerifierBackend",
]

SequenceId = int


# ---- operations -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartSequence:
    """A new sequence from tokens. params None makes it prefill-only: it computes token_ids, reports
    READOUT and stays paused (readout_positions name the positions a backend may read out)."""

    seq_id: SequenceId
    token_ids: tuple[int, ...]
    params: SamplingParams | None
    priority: int = 0
    multiplicity: int = 1
    readout_positions: tuple[int, ...] = ()
    abort_on_preempt: bool = False
    split_ids: tuple[SequenceId, ...] = ()
    lane_seeds: tuple[int, ...] | None = None  # one per logical copy; None: lanes derived from params.seed


@dataclass(frozen=True)
class BranchSequence:
    """A new sequence sharing all of paused `source`'s KV (no copy), extended by token_ids and
    generating its next segment with params."""

    seq_id: SequenceId
    source: SequenceId
    params: SamplingParams
    token_ids: tuple[int, ...] = ()
    priority: int = 0
    multiplicity: int = 1
    abort_on_preempt: bool = False
    split_ids: tuple[SequenceId, ...] = ()
    lane_seeds: tuple[int, ...] | None = None  # one per logical copy; None: lanes derived from params.seed


@dataclass(frozen=True)
class AbortSequence:
    """End the sequence and free its KV at once."""

    seq_id: SequenceId


@dataclass(frozen=True)
class PauseSequence:
    """Stop a generating sequence where it is, keeping its KV (a no-op if it is not generating): e.g.
    FastTTS's valve pausing a request's oldest running continuation (docs/design.md, "Speculation")."""

    seq_id: SequenceId


@dataclass(frozen=True)
class PrioritizeSequence:
    """Re-rank a sequence. resume: also continue it if a `PauseSequence` stopped it, and let the
    scheduler preempt it by recompute from now on (it is no longer disposable speculative work)."""

    seq_id: SequenceId
    priority: int
    resume: bool = False


SequenceOp = Union[StartSequence, BranchSequence, AbortSequence, PauseSequence, PrioritizeSequence]


# ---- outputs --------------------------------------------------------------------------------------
class SequenceState(enum.Enum):
    GENERATING = "generating"  # still sampling its segment (or waiting to run)
    STOPPED = "stopped"  # hit a stop string: paused with its KV kept, ready to be branched
    FINISHED = "finished"  # ended (EOS, token or context cap); its KV is freed
    LOST = "lost"  # preempted while it asked to be aborted rather than recomputed; its KV is freed
    READOUT = "readout"  # a prefill-only sequence computed its tokens; paused with its KV kept


class EndReason(enum.Enum):
    """Why a STOPPED or FINISHED sequence's segment ended (the API's finish_reason)."""

    STOP = "stop"  # a stop string or EOS
    LENGTH = "length"  # cut by the segment's token cap or the context limit


@dataclass(frozen=True)
class SequenceUpdate:
    """What one iteration did to one sequence. split_from: the sequence this one split off in this
    iteration (it inherits split_from's segment so far; split_from's own update comes first).
    lane_ids: the logical copies (lanes, numbered as started) this row holds now, multiplicity of them.
    end_reason: why the segment ended, once the state is STOPPED or FINISHED."""

    seq_id: SequenceId
    new_token_ids: tuple[int, ...]
    state: SequenceState
    multiplicity: int
    lane_ids: tuple[int, ...]
    split_from: SequenceId | None = None
    end_reason: EndReason = EndReason.STOP


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
