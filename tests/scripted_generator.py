"""ScriptedGenerator: a deterministic `GeneratorBackend` (runtime/backend.py) on a virtual clock, for exact
tests of the search logic (the real engine and PRM are tested end to end elsewhere).

Step texts are a function of (prefix tokens, seed): a row of multiplicity m stands for m logical copies
(lanes) with its m lane seeds (`lane_seeds`, else s..s+m-1 for params.seed s) — exactly the seeds of the
children it replaces — and splits where their scripted texts diverge, as the real engine's laned multi-draw
sampling does: each split row carries the lanes of its copies and takes the next id the starting operation
reserved (runtime/backend.py). Each iteration emits one token per generating row and advances the clock
by `decode_cost`. `spare_rows` models the engine's speculative row budget (engine/scheduler.py): a
low-priority (speculative) row runs only while the iteration has fewer rows. Tokens 0..25 are the letters a..z, then a space, a newline and EOS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from specscale.seam import (
    AbortSequence,
    BranchSequence,
    KVUsage,
    PauseSequence,
    PrioritizeSequence,
    SamplingParams,
    SequenceId,
    SequenceOp,
    SequenceState,
    SequenceUpdate,
    StartSequence,
)
from specscale.sim.clock import VirtualClock

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPACE, NEWLINE, EOS = 26, 27, 99


def stable_hash(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def seeded_step(prefix: tuple, seed: int, final: bool, min_len=2, max_len=12, stop_rate=0.15) -> list[int]:
    """A step whose letters and length depend on (prefix, seed); ends with "\\n\\n", or EOS when the
    path completes (final round, or by chance once a few steps exist)."""
    h = stable_hash(prefix, seed)
    length = min_len + h % (max_len - min_len + 1)
    letters = [(h >> (5 * i)) % 26 for i in range(length)]
    depth = sum(1 for a, b in pairwise(prefix) if a == b == NEWLINE)
    completes = final or (depth >= 2 and (h >> 60) / 16 < stop_rate)
    return letters + ([EOS] if completes else [NEWLINE, NEWLINE])


def prefix_only_step(prefix: tuple, seed: int, final: bool) -> list[int]:
    """Ignores the seed: every child of one prefix writes the same step (maximal sharing for CD)."""
    return seeded_step(prefix, 0, final)


def decode(token_ids: Sequence[int]) -> str:
    return "".join(LETTERS[i] if i < 26 else " " if i == SPACE else "\n" if i == NEWLINE else "" for i in token_ids)


@dataclass(eq=False)
class ScriptedSequence:
    tokens: list[int]
    params: SamplingParams | None  # None: prefill-only
    priority: int
    multiplicity: int
    split_ids: list[SequenceId]  # shared by the rows of one family
    state: SequenceState = SequenceState.GENERATING
    paused: bool = False
    plans: list[list[int]] = field(default_factory=list)  # per logical copy: its scripted step
    position: int = 0  # tokens of the step emitted so far
    lane_seeds: tuple[int, ...] | None = None
    lane_ids: list[int] = field(default_factory=lambda: [0])  # parallel to plans


class ScriptedGenerator:
    """One KV block per live sequence, out of `num_blocks`."""

    def __init__(self, clock: VirtualClock, step_fn=seeded_step, decode_cost: float = 1.0, num_blocks: int = 1000,
                 spare_rows: int | None = None):
        self.clock, self.step_fn, self.decode_cost, self.num_blocks = clock, step_fn, decode_cost, num_blocks
        self.spare_rows = spare_rows
        self.seqs: dict[SequenceId, ScriptedSequence] = {}
        self.rows_per_step: list[int] = []
        self._handlers = {StartSequence: self._start, BranchSequence: self._branch, AbortSequence: self._abort,
                          PauseSequence: self._pause, PrioritizeSequence: self._prioritize}

    # ---- GeneratorBackend ----------------------------------------------------------------------------
    def apply(self, ops: Sequence[SequenceOp]) -> None:
        for op in ops:
            self._handlers[type(op)](op)

    def step(self) -> list[SequenceUpdate]:
        running = self._running()
        self.rows_per_step.append(len(running))
        self.clock.advance(self.decode_cost)
        updates = []
        for seq_id, seq in running:
            updates += self._advance(seq_id, seq)
        return updates

    def has_work(self) -> bool:
        return bool(self._running())

    def _running(self) -> list[tuple[SequenceId, ScriptedSequence]]:
        """This iteration's rows: every generating sequence at priority >= 0, then speculative ones (highest
        priority first, then oldest) while the rows number fewer than `spare_rows`."""
        generating = [(seq_id, s) for seq_id, s in self.seqs.items() if self._generating(s)]
        if self.spare_rows is None:
            return generating
        rows = [(seq_id, s) for seq_id, s in generating if s.priority >= 0]
        speculative = sorted((row for row in generating if row[1].priority < 0), key=lambda row: -row[1].priority)
        return rows + speculative[:max(self.spare_rows - len(rows), 0)]

    def decode(self, token_ids: Sequence[int]) -> str:
        return decode(token_ids)

    @property
    def num_live_sequences(self) -> int:
        return len(self.seqs)

    @property
    def kv_usage(self) -> KVUsage:
        return KVUsage(len(self.seqs), self.num_blocks)

    # ---- operations ----------------------------------------------------------------------------------
    def _start(self, op: StartSequence) -> None:
        seq = ScriptedSequence(list(op.token_ids), op.params, op.priority, op.multiplicity, list(op.split_ids),
                               lane_seeds=op.lane_seeds)
        self.seqs[op.seq_id] = seq
        if op.params is not None:
            self._plan(seq)

    def _branch(self, op: BranchSequence) -> None:
        source = self.seqs[op.source]
        assert source.state in (SequenceState.STOPPED, SequenceState.READOUT), "a branch needs a paused source"
        seq = ScriptedSequence(source.tokens + list(op.token_ids), op.params, op.priority, op.multiplicity,
                               list(op.split_ids), lane_seeds=op.lane_seeds)
        self.seqs[op.seq_id] = seq
        self._plan(seq)

    def _abort(self, op: AbortSequence) -> None:
        self.seqs.pop(op.seq_id, None)

    def _pause(self, op: PauseSequence) -> None:
        seq = self.seqs.get(op.seq_id)
        if seq is not None and seq.state == SequenceState.GENERATING:
            seq.paused = True

    def _prioritize(self, op: PrioritizeSequence) -> None:
        seq = self.seqs.get(op.seq_id)
        if seq is not None:
            seq.priority = op.priority
            seq.paused = seq.paused and not op.resume

    # ---- scripting -----------------------------------------------------------------------------------
    @staticmethod
    def _generating(seq: ScriptedSequence) -> bool:
        return seq.state == SequenceState.GENERATING and not seq.paused

    def _plan(self, seq: ScriptedSequence) -> None:
        seeds = seq.lane_seeds or [(seq.params.seed or 0) + j for j in range(seq.multiplicity)]
        final = not seq.params.stop
        seq.plans = [self.step_fn(tuple(seq.tokens), seed, final) for seed in seeds]
        seq.lane_ids = list(range(seq.multiplicity))

    def _advance(self, seq_id: SequenceId, seq: ScriptedSequence) -> list[SequenceUpdate]:
        if seq.params is None:
            seq.state = SequenceState.READOUT
            return [SequenceUpdate(seq_id, (), seq.state, seq.multiplicity, tuple(seq.lane_ids))]
        groups: dict[int, list[int]] = {}  # next token -> the copies (indices into plans) that write it
        for j, plan in enumerate(seq.plans):  # copies whose next scripted token agrees stay one row
            groups.setdefault(plan[seq.position], []).append(j)
        (token, copies), *others = groups.items()
        targets = [(seq_id, seq, token, copies, None)]
        for other_token, other_copies in others:
            child_id = seq.split_ids.pop(0)
            child = ScriptedSequence(list(seq.tokens), seq.params, seq.priority, len(other_copies), seq.split_ids,
                                     position=seq.position)
            self.seqs[child_id] = child
            targets.append((child_id, child, other_token, other_copies, seq_id))
        plans, lane_ids = seq.plans, seq.lane_ids
        updates = []
        for target_id, target, tok, copies, split_from in targets:
            target.plans, target.lane_ids = [plans[j] for j in copies], [lane_ids[j] for j in copies]
            target.multiplicity = len(copies)
            updates.append(self._emit(target_id, target, tok, split_from))
        return updates

    def _emit(self, seq_id: SequenceId, seq: ScriptedSequence, token: int, split_from) -> SequenceUpdate:
        seq.position += 1
        seq.tokens.append(token)
        if token == EOS:
            seq.state = SequenceState.FINISHED
            self.seqs.pop(seq_id)
        elif seq.position == len(seq.plans[0]):
            seq.state = SequenceState.STOPPED
        return SequenceUpdate(seq_id, (token,), seq.state, seq.multiplicity, tuple(seq.lane_ids), split_from)
