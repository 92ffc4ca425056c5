"""A scripted, deterministic generator engine and verifier with the real ones' interface, on a
virtual clock: exact tests of the search logic (the real engine and PRM are tested end to end
elsewhere).

Step texts are a function of (prefix tokens, seed): a row of multiplicity m stands for m logical copies
with its m lane seeds — exactly the seeds of the children it replaces — and splits where their
scripted texts diverge, as the real engine's laned multi-draw sampling does. Each iteration emits one token
per running row and advances the clock by `decode_cost`; a verifier call advances it by `prm_cost`.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field

from specscale.engine.engine import SequenceOutput
from specscale.engine.sequence import FinishReason, SequenceStatus
from specscale.model.memory import ModelMemory
from specscale.sim.clock import VirtualClock
from specscale.verify.prm import ScoreResult

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPACE, NEWLINE, EOS = 26, 27, 99


def stable_hash(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


class FakeTokenizer:
    def decode(self, ids) -> str:
        return "".join(LETTERS[i] if i < 26 else " " if i == SPACE else "\n" if i == NEWLINE else "" for i in ids)


def seeded_step(prefix: tuple, seed: int, final: bool, min_len=2, max_len=12, stop_rate=0.15) -> list[int]:
    """A step whose letters and length depend on (prefix, seed); ends with "\\n\\n", or EOS when the
    path completes (final round, or by chance once a few steps exist)."""
    h = stable_hash(prefix, seed)
    length = min_len + h % (max_len - min_len + 1)
    letters = [(h >> (5 * i)) % 26 for i in range(length)]
    depth = sum(1 for a, b in zip(prefix, prefix[1:]) if a == b == NEWLINE)
    completes = final or (depth >= 2 and (h >> 60) / 16 < stop_rate)
    return letters + ([EOS] if completes else [NEWLINE, NEWLINE])


def prefix_only_step(prefix: tuple, seed: int, final: bool) -> list[int]:
    """Ignores the seed: every child of one prefix writes the same step (maximal sharing for CD)."""
    return seeded_step(prefix, 0, final)


@dataclass(eq=False)
class FakeSeq:
    seq_id: int
    tokens: list[int]
    params: object | None
    priority: int
    multiplicity: int
    abort_on_preempt: bool = False
    status: SequenceStatus = SequenceStatus.WAITING
    plans: list[list[int]] = field(default_factory=list)  # per logical copy: its scripted step
    position: int = 0  # tokens of the step emitted so far
    readout: bool = False
    lane_seeds: tuple[int, ...] | None = None
    lane_ids: list[int] = field(default_factory=lambda: [0])  # parallel to plans


class _Blocks:
    def __init__(self, engine):
        self.engine = engine

    @property
    def num_used_blocks(self) -> int:
        return len(self.engine.seqs)


class ScriptedEngine:
    def __init__(self, clock: VirtualClock, step_fn=seeded_step, decode_cost: float = 1.0):
        self.clock, self.step_fn, self.decode_cost = clock, step_fn, decode_cost
        self.seqs: dict[int, FakeSeq] = {}
        self.tokenizer = FakeTokenizer()
        self.block_manager = _Blocks(self)
        self.rows_per_step: list[int] = []
        self._ids = itertools.count()

    # ---- the Engine interface the runtime uses ----
    def add(self, prompt_ids, params=None, *, priority=0, multiplicity=1, readout_positions=None,
            abort_on_preempt=False, lane_seeds=None) -> int:
        seq = FakeSeq(next(self._ids), list(prompt_ids), params, priority, multiplicity, abort_on_preempt)
        seq.readout, seq.lane_seeds = params is None, lane_seeds
        self.seqs[seq.seq_id] = seq
        if not seq.readout:
            self._plan(seq)
        return seq.seq_id

    def extend(self, seq_id, params=None, *, token_ids=(), priority=None, multiplicity=None,
               readout_positions=None, abort_on_preempt=False, lane_seeds=None) -> None:
        seq = self.seqs[seq_id]
        seq.lane_seeds = lane_seeds
        assert seq.status == SequenceStatus.PAUSED, "extend needs a paused sequence"
        seq.tokens += list(token_ids)
        seq.params = params or seq.params
        seq.readout = False
        seq.priority = seq.priority if priority is None else priority
        seq.multiplicity = seq.multiplicity if multiplicity is None else multiplicity
        seq.abort_on_preempt = abort_on_preempt
        self._plan(seq)
        seq.status = SequenceStatus.RUNNING

    def fork(self, seq_id, n, multiplicity=1) -> list[int]:
        parent = self.seqs[seq_id]
        children = []
        for _ in range(n):
            child = FakeSeq(next(self._ids), list(parent.tokens), parent.params, parent.priority, multiplicity,
                            parent.abort_on_preempt, parent.status, [list(p) for p in parent.plans], parent.position,
                            lane_ids=list(parent.lane_ids))
            self.seqs[child.seq_id] = child
            children.append(child.seq_id)
        return children

    def abort(self, seq_id) -> bool:
        return self.seqs.pop(seq_id, None) is not None

    def pause(self, seq_id) -> bool:
        seq = self.seqs.get(seq_id)
        if seq is None or seq.status != SequenceStatus.RUNNING:
            return False
        seq.status = SequenceStatus.PAUSED
        return True

    def resume(self, seq_id, priority=None, abort_on_preempt=False) -> None:
        seq = self.seqs[seq_id]
        seq.status = SequenceStatus.RUNNING
        seq.priority = seq.priority if priority is None else priority
        seq.abort_on_preempt = abort_on_preempt

    def set_priority(self, seq_id, priority, abort_on_preempt=None) -> None:
        self.seqs[seq_id].priority = priority

    def get(self, seq_id):
        return self.seqs.get(seq_id)

    @property
    def num_live_sequences(self) -> int:
        return len(self.seqs)

    def model_memory(self) -> ModelMemory:
        return ModelMemory(weight_bytes=0, kv_cache_bytes=0, rope_table_bytes=0, device="cpu")  # no tensors held

    def has_work(self) -> bool:
        return any(s.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING) for s in self.seqs.values())

    def step(self) -> list[SequenceOutput]:
        running = [s for s in self.seqs.values() if s.status in (SequenceStatus.RUNNING, SequenceStatus.WAITING)]
        self.rows_per_step.append(len(running))
        self.clock.advance(self.decode_cost)
        outputs = []
        for seq in running:
            outputs += self._advance(seq)
        return outputs

    # ---- scripting ----
    def _plan(self, seq: FakeSeq) -> None:
        seeds = seq.lane_seeds or [(seq.params.seed or 0) + j for j in range(seq.multiplicity)]
        final = not seq.params.stop
        seq.plans = [self.step_fn(tuple(seq.tokens), seed, final) for seed in seeds]
        seq.lane_ids = list(range(seq.multiplicity))
        seq.position = 0

    def _advance(self, seq: FakeSeq) -> list[SequenceOutput]:
        if seq.readout:
            seq.status = SequenceStatus.PAUSED
            return [SequenceOutput(seq.seq_id, [], seq.status, FinishReason.READOUT, seq.multiplicity,
                                   lane_ids=tuple(seq.lane_ids))]
        groups: dict[int, list[int]] = {}
        for j, plan in enumerate(seq.plans):  # copies whose next scripted token agrees stay one row
            groups.setdefault(plan[seq.position], []).append(j)
        (token, copies), *others = groups.items()
        targets = [(seq, token, copies, None)]
        for other_token, other_copies in others:
            child = self.seqs[self.fork(seq.seq_id, 1)[0]]
            targets.append((child, other_token, other_copies, seq.seq_id))
        plans, lane_ids = seq.plans, seq.lane_ids
        outputs = []
        for target, tok, copies, parent_id in targets:
            target.plans, target.lane_ids = [plans[j] for j in copies], [lane_ids[j] for j in copies]
            target.multiplicity, target.status = len(copies), SequenceStatus.RUNNING
            outputs.append(self._emit(target, tok, parent_id))
        return outputs

    def _emit(self, seq: FakeSeq, token: int, parent_id) -> SequenceOutput:
        seq.position += 1
        seq.tokens.append(token)
        reason = None
        if token == EOS:
            reason, seq.status = FinishReason.EOS, SequenceStatus.FINISHED
            self.seqs.pop(seq.seq_id)
        elif seq.position == len(seq.plans[0]):
            reason, seq.status = FinishReason.STOP, SequenceStatus.PAUSED
        return SequenceOutput(seq.seq_id, [token], seq.status, reason, seq.multiplicity, parent_id,
                              lane_ids=tuple(seq.lane_ids))


def hashed_scores(question: str, steps: tuple[str, ...], perfect_rate: float = 0.0,
                  score_levels: int = 10_000) -> float:
    """A fixed score in [0, 1): one of `score_levels` values (few levels: many ties), or exactly 1.0 at
    `perfect_rate`."""
    h = stable_hash(question, steps)
    if (h % 1000) / 1000 < perfect_rate:
        return 1.0
    return ((h >> 10) % score_levels) / score_levels


class ScriptedVerifier:
    """Step j's score is a fixed function of (question, steps 1..j)."""

    def __init__(self, clock: VirtualClock, prm_cost: float = 0.5, perfect_rate: float = 0.0,
                 score_levels: int = 10_000):
        self.clock, self.prm_cost, self.perfect_rate = clock, prm_cost, perfect_rate
        self.score_levels = score_levels
        self.batches: list[int] = []

    def score(self, requests) -> list[ScoreResult]:
        self.batches.append(len(requests))
        self.clock.advance(self.prm_cost)
        results = []
        for r in requests:
            steps = tuple(s for s in r.steps if s.strip())
            scores = tuple(hashed_scores(r.question, steps[: j + 1], self.perfect_rate, self.score_levels)
                           for j in range(len(steps)))
            results.append(ScoreResult(scores, len(steps)))
        return results

    def tokens_to_compute(self, request) -> int:
        return len(request.steps[-1]) + 1
