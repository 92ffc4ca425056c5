"""Sequences: the engine sequences the search runtime started, each by the id the runtime gave it, and the
generator operations on them not yet handed over (docs/architecture.md, step 4).

The runtime names every sequence (`new_ids`) and queues its operations here; `flush` hands them to the
generator as one batch, and the generator sees the same calls in the same order as if each were made at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from specscale.runtime.backend import GeneratorBackend
from specscale.runtime.metrics import RunMetrics
from specscale.runtime.request_state import Physical, RequestState
from specscale.seam import AbortSequence, SequenceId, SequenceOp, SequenceUpdate


class Sequences:
    def __init__(self, generator: GeneratorBackend, clock: Callable[[], float]):
        self.generator = generator
        self.clock = clock
        self.physical: dict[SequenceId, Physical] = {}
        self._ids = itertools.count()
        self._ops: list[SequenceOp] = []  # operations not yet handed to the generator

    def new_ids(self, multiplicity: int) -> tuple[SequenceId, tuple[SequenceId, ...]]:
        """A new sequence id and the ids reserved for the rows it may split into (CD)."""
        return next(self._ids), tuple(next(self._ids) for _ in range(multiplicity - 1))

    def track(self, seq: SequenceId, phys: Physical) -> None:
        self.physical[seq] = phys

    def queue(self, op: SequenceOp) -> None:
        self._ops.append(op)

    def flush(self) -> None:
        """Hand the queued operations to the generator as one batch."""
        if self._ops:
            ops, self._ops = self._ops, []
            self.generator.apply(ops)

    def release(self, seq: SequenceId) -> Physical | None:
        """Abort a sequence (its unshared blocks are freed when the queued operations are applied); its record,
        if the runtime still had one."""
        phys = self.physical.pop(seq, None)
        self._ops.append(AbortSequence(seq))
        return phys

    def cancel(self, seq: SequenceId, metrics: RunMetrics) -> None:
        """Abort a sequence whose work is thrown away, and account for that work."""
        phys = self.release(seq)
        if phys is not None:
            self.account_cancelled(phys, metrics)

    def account_cancelled(self, phys: Physical, metrics: RunMetrics) -> None:
        """A cancelled sequence's tokens and lifetime; a speculative one's tokens were wasted."""
        metrics.cancelled(len(phys.tokens), self.clock() - phys.created_at)
        if phys.speculative:
            phys.request.wasted_tokens += len(phys.tokens)

    def register_splits(self, updates: list[SequenceUpdate]) -> None:
        """CD: a sequence split this iteration; the child inherits the parent's step so far."""
        for update in updates:
            parent = self.physical.get(update.split_from) if update.split_from is not None else None
            if parent is None:
                continue
            child = Physical(parent.request, parent.expansion_id, parent.speculative, self.clock(),
                             update.multiplicity, parent.paused, list(parent.tokens), parent.origin)
            self.physical[update.seq_id] = child
            parent.request.expansion_seqs.setdefault(parent.expansion_id, set()).add(update.seq_id)

    def of_request(self, state: RequestState) -> list[SequenceId]:
        return [seq for seq, phys in self.physical.items() if phys.request is state]

    def generating_multiplicities(self) -> list[int]:
        return [p.multiplicity for p in self.physical.values() if p.expansion_id is not None and not p.paused]

    def speculative_tokens(self) -> dict[int, int]:
        """Tokens written by speculative sequences, per request (keyed by `id` of its state)."""
        speculative: dict[int, int] = {}
        for phys in self.physical.values():
            if phys.speculative:
                speculative[id(phys.request)] = speculative.get(id(phys.request), 0) + len(phys.tokens)
        return speculative

    def longest_written(self, state: RequestState, origin: int) -> list[int]:
        """The most tokens any sequence started for this request's expansion `origin` has written so far."""
        return max((p.tokens for p in self.physical.values() if p.request is state and p.origin == origin),
                   key=len, default=[])
