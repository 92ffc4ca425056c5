"""EngineBackend: `engine/engine.py`'s `Engine` as a `GeneratorBackend` (runtime/backend.py).

It maps the runtime's sequence ids to the engine's and back, turns the runtime's operations into engine
calls (`add`, `fork` + `extend`, `abort`, `pause`, `resume`, `set_priority`; lane seeds passed through)
and the engine's `SequenceOutput`s into `SequenceUpdate`s (lane ids kept, LENGTH / CONTEXT finish reasons
as `EndReason.LENGTH`); a row the engine splits off (CD) takes the next id its family reserved. The engine may run a checkpoint or the simulator's runner (docs/simulator.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from specscale.engine.engine import Engine, SequenceOutput
from specscale.engine.sequence import FinishReason, SequenceStatus
from specscale.seam import (
    AbortSequence,
    BranchSequence,
    EndReason,
    KVUsage,
    PauseSequence,
    PrioritizeSequence,
    SequenceId,
    SequenceOp,
    SequenceState,
    SequenceUpdate,
    StartSequence,
)

ENDED = {FinishReason.READOUT: SequenceState.READOUT, FinishReason.PREEMPTED: SequenceState.LOST}
BY_STATUS = {SequenceStatus.RUNNING: SequenceState.GENERATING, SequenceStatus.WAITING: SequenceState.GENERATING,
             SequenceStatus.PAUSED: SequenceState.STOPPED, SequenceStatus.FINISHED: SequenceState.FINISHED}
CUT = {FinishReason.LENGTH, FinishReason.CONTEXT}


class EngineBackend:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._to_engine: dict[SequenceId, int] = {}
        self._from_engine: dict[int, SequenceId] = {}
        self._split_ids: dict[int, list[SequenceId]] = {}  # engine id -> its family's unused reserved ids
        self._handlers: dict[type, Callable[[Any], None]] = {StartSequence: self._start, BranchSequence: self._branch, AbortSequence: self._abort,
                          PauseSequence: self._pause, PrioritizeSequence: self._prioritize}

    # ---- GeneratorBackend ------------------------------------------------------------------------
    def apply(self, ops: Sequence[SequenceOp]) -> None:
        for op in ops:
            self._handlers[type(op)](op)

    def step(self) -> list[SequenceUpdate]:
        outputs = self.engine.step()
        updates = [self._update(out) for out in outputs]  # a row splits off its parent after the parent's update
        for out, update in zip(outputs, updates, strict=True):
            if update.state in (SequenceState.FINISHED, SequenceState.LOST):
                self._forget(out.seq_id)
        return updates

    def has_work(self) -> bool:
        return self.engine.has_work()

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.engine.tokenizer.decode(list(token_ids))

    @property
    def num_live_sequences(self) -> int:
        return self.engine.num_live_sequences

    @property
    def kv_usage(self) -> KVUsage:
        return self.engine.block_manager.usage

    # ---- operations ----------------------------------------------------------------------------
    def _start(self, op: StartSequence) -> None:
        engine_id = self.engine.add(list(op.token_ids), op.params, priority=op.priority,
                                    multiplicity=op.multiplicity, readout_positions=list(op.readout_positions),
                                    abort_on_preempt=op.abort_on_preempt, lane_seeds=op.lane_seeds)
        self._name(op.seq_id, engine_id, list(op.split_ids))

    def _branch(self, op: BranchSequence) -> None:
        engine_id = self.engine.fork(self._to_engine[op.source], 1)[0]
        self.engine.extend(engine_id, op.params, token_ids=list(op.token_ids), priority=op.priority,
                           multiplicity=op.multiplicity, abort_on_preempt=op.abort_on_preempt,
                           lane_seeds=op.lane_seeds)
        self._name(op.seq_id, engine_id, list(op.split_ids))

    def _abort(self, op: AbortSequence) -> None:
        engine_id = self._to_engine.get(op.seq_id)
        if engine_id is not None:
            self.engine.abort(engine_id)
            self._forget(engine_id)

    def _pause(self, op: PauseSequence) -> None:
        engine_id = self._live(op.seq_id)
        if engine_id is not None:
            self.engine.pause(engine_id)

    def _prioritize(self, op: PrioritizeSequence) -> None:
        engine_id = self._live(op.seq_id)
        if engine_id is None:
            return
        if op.resume and self.engine.get(engine_id).status == SequenceStatus.PAUSED:
            self.engine.resume(engine_id, op.priority)
        elif op.resume:  # the pause may not have happened
            self.engine.set_priority(engine_id, op.priority, abort_on_preempt=False)
        else:
            self.engine.set_priority(engine_id, op.priority)

    # ---- ids ------------------------------------------------------------------------------------
    def _name(self, seq_id: SequenceId, engine_id: int, split_ids: list[SequenceId]) -> None:
        self._to_engine[seq_id] = engine_id
        self._from_engine[engine_id] = seq_id
        self._split_ids[engine_id] = split_ids

    def _live(self, seq_id: SequenceId) -> int | None:
        """The engine id of a sequence the engine still holds (it may have finished in this iteration)."""
        engine_id = self._to_engine.get(seq_id)
        return engine_id if engine_id is not None and self.engine.get(engine_id) is not None else None

    def _forget(self, engine_id: int) -> None:
        seq_id = self._from_engine.pop(engine_id)
        self._to_engine.pop(seq_id, None)
        self._split_ids.pop(engine_id, None)

    def _update(self, out: SequenceOutput) -> SequenceUpdate:
        split_from = None
        if out.parent_id is not None:
            family = self._split_ids[out.parent_id]
            split_from = self._from_engine[out.parent_id]
            self._name(family.pop(0), out.seq_id, family)
        seq_id = self._from_engine[out.seq_id]
        state = ENDED.get(out.finish_reason) or BY_STATUS[out.status]
        end_reason = EndReason.LENGTH if out.finish_reason in CUT else EndReason.STOP
        return SequenceUpdate(seq_id, tuple(out.new_token_ids), state, out.multiplicity, tuple(out.lane_ids),
                              split_from, end_reason)
