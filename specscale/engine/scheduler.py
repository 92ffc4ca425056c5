"""Continuous batching under a token budget: decode rows and chunked prefill in one iteration.

Sequences are served in priority order (higher first, then older first). Each gets as many of its
uncomputed tokens as the budget leaves (1 for a decode row, a chunk for a prefill). Low-priority
(speculative) rows only use spare room: they join while the iteration has fewer than `spare_rows` rows. When the KV pool
runs out, the lowest-priority, newest sequence that ranks below the one being scheduled (else a PAUSED
sequence of any rank), among those holding a block no other sequence shares, is preempted by recompute: its blocks are freed and its tokens recomputed later (or it is aborted if it asked to
be). Nothing is lost and nothing crashes: a sequence that cannot fit simply waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from specscale.engine.block_manager import BlockManager
from specscale.engine.sequence import FinishReason, Sequence, SequenceStatus


@dataclass
class ScheduledRow:
    seq: Sequence
    start: int  # first position computed this iteration (= num_computed_tokens when scheduled)
    num_tokens: int

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def reaches_last_token(self) -> bool:
        return self.end == len(self.seq.token_ids)


@dataclass
class ScheduledBatch:
    decode_rows: list[ScheduledRow] = field(default_factory=list)  # one token each
    prefill_rows: list[ScheduledRow] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst), before the forward
    aborted: list[Sequence] = field(default_factory=list)  # preempted sequences that asked to be aborted

    @property
    def rows(self) -> list[ScheduledRow]:
        return self.decode_rows + self.prefill_rows

    @property
    def num_tokens(self) -> int:
        return len(self.decode_rows) + sum(row.num_tokens for row in self.prefill_rows)

    @property
    def is_empty(self) -> bool:
        return not self.decode_rows and not self.prefill_rows


WAITING, RUNNING = SequenceStatus.WAITING, SequenceStatus.RUNNING


def rank(seq: Sequence) -> tuple[int, int]:
    """Larger ranks run first: higher priority, then older."""
    return (seq.priority, -seq.arrival)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int, max_num_seqs: int,
                 spare_rows: int | None = None):
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.spare_rows = max_num_seqs if spare_rows is None else spare_rows
        self.sequences: dict[int, Sequence] = {}  # every live (not finished) sequence
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.sequences[seq.seq_id] = seq

    def remove(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        self.sequences.pop(seq.seq_id, None)

    def has_work(self) -> bool:
        """Whether the next iteration would run a row. A low-priority (speculative) sequence counts only when
        the row budget leaves it room (`spare_rows` > 0): with none it waits to be promoted, and a caller that
        stepped on it would spin on empty iterations (the runtime's idle flush, docs/design.md "Verification" trigger 4, relies on this)."""
        return any(s.priority >= 0 or self.spare_rows > 0 for s in self._schedulable())

    def _schedulable(self) -> Iterator[Sequence]:
        """The live sequences with `is_schedulable` (inlined: this runs over every live sequence each iteration)."""
        return (s for s in self.sequences.values()
                if (s.status is WAITING or s.status is RUNNING) and s.num_computed_tokens < len(s.token_ids))

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        scheduled: set[int] = set()
        queue = sorted(self._schedulable(), key=rank, reverse=True)
        for seq in queue:
            if budget == 0 or len(scheduled) == self.max_num_seqs:
                break
            if seq.priority < 0 and len(scheduled) >= self.spare_rows:
                break  # the queue is sorted: only low-priority work is left, and there is no spare room
            if seq.seq_id not in self.sequences:  # aborted as a preemption victim earlier in this loop
                continue
            row = self._try_schedule(seq, budget, scheduled, batch)
            if row is not None:
                scheduled.add(seq.seq_id)
                budget -= row.num_tokens
                (batch.decode_rows if row.num_tokens == 1 else batch.prefill_rows).append(row)
        return batch

    def _try_schedule(self, seq, budget, scheduled, batch) -> ScheduledRow | None:
        bm = self.block_manager
        if not seq.block_table:
            bm.allocate_cached_prefix(seq)
        num_tokens = min(len(seq.token_ids) - seq.num_computed_tokens, budget)  # seq.num_uncomputed_tokens
        needed = bm.blocks_needed(seq, num_tokens)
        while needed > bm.num_free_blocks:
            victims = self._pick_victims(seq, scheduled, needed - bm.num_free_blocks)
            if not victims:
                return None  # waits; it keeps the blocks it has
            for victim in victims:
                self._preempt(victim, batch)
            needed = bm.blocks_needed(seq, num_tokens)  # a victim may have shared seq's last block
        copies = bm.allocate_slots(seq, num_tokens)
        if copies:
            batch.block_copies += copies
        seq.status = SequenceStatus.RUNNING
        return ScheduledRow(seq, seq.num_computed_tokens, num_tokens)

    def _pick_victims(self, seq: Sequence, scheduled: set[int], shortfall: int) -> list[Sequence]:
        """Sequences whose preemption together returns >= shortfall blocks to the pool, or [] if none do.

        Candidates, in order: holders that rank below seq (lowest first), then PAUSED holders of any rank
        (they are not running; they recompute when extended). A block returns to the pool only when all
        its holders are preempted, so forks sharing a prefix are freed as a group; candidates whose
        blocks stay held by others would free nothing and are left alone (picking them forever was a
        livelock)."""
        holders = [s for s in self.sequences.values() if s.block_table and s.seq_id not in scheduled and s is not seq]
        below = sorted((s for s in holders if rank(s) < rank(seq)), key=rank)
        paused = sorted((s for s in holders if rank(s) >= rank(seq) and s.status == SequenceStatus.PAUSED), key=rank)
        released: dict[int, int] = {}  # block -> holders among the victims so far
        victims, freed = [], 0
        for candidate in below + paused:
            victims.append(candidate)
            for block in set(candidate.block_table):
                released[block] = released.get(block, 0) + 1
                freed += released[block] == self.block_manager.ref_count[block]
            if freed >= shortfall:
                return [v for v in victims if any(released[b] == self.block_manager.ref_count[b] for b in v.block_table)]
        return []

    def _preempt(self, victim: Sequence, batch: ScheduledBatch) -> None:
        self.num_preemptions += 1
        victim.readouts.clear()
        if victim.abort_on_preempt:
            victim.status = SequenceStatus.FINISHED
            victim.finish_reason = FinishReason.PREEMPTED
            self.remove(victim)
            batch.aborted.append(victim)
            return
        self.block_manager.free(victim)  # recompute later; its tokens are kept
        if victim.status == SequenceStatus.RUNNING:
            victim.status = SequenceStatus.WAITING
