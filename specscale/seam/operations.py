"""The operations a runtime hands a generator backend, one batch per tick (`GeneratorBackend.apply`).
Operations on a sequence that has already ended (it finished in the iteration whose updates the runtime is
still reading) are ignored."""

from __future__ import annotations

from dataclasses import dataclass

from specscale.seam.sampling import SamplingParams

SequenceId = int  # named by the runtime, unique for the backend's life


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


SequenceOp = StartSequence | BranchSequence | AbortSequence | PauseSequence | PrioritizeSequence
