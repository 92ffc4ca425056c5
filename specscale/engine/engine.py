"""Engine: add / extend / fork / abort sequences and step() them through schedule -> run -> update.

A generating sequence runs one *segment* at a time: it samples until EOS, its segment's
max_new_tokens, the context cap, or a stop string. At a stop string it is PAUSED with its KV kept;
`extend` starts its next segment without recomputing the prefix, `fork` shares its blocks.

A sequence of multiplicity m (computation deduplication) draws m independent tokens per iteration
from its one logits row; equal draws stay together and each further distinct token forks a child
sequence of multiplicity = its count. The m logical candidates are distributed exactly like m
independent sequences. A seeded sequence holds one generator per logical copy (its *lanes*, seeded
with `lane_seeds`): copy j draws only from lane j, and a split hands each child the lanes of its
draws, so given equal logits a row of multiplicity m samples what its m copies would sample as m
separate rows seeded alike (docs/design.md, "Seeds").

A prefill-only (readout) sequence computes given tokens and returns the head outputs at requested
positions (the PRM verifier's path), then pauses so a later call can extend it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from specscale.config import EngineConfig
from specscale.engine.block_manager import BlockManager
from specscale.engine.model_runner import ModelRunner, RunnerOutput
from specscale.engine.sampler import Sampler, SampleRow
from specscale.engine.scheduler import ScheduledBatch, ScheduledRow, Scheduler
from specscale.engine.sequence import FinishReason, Sequence, SequenceStatus
from specscale.engine.torch_runner import TorchModelRunner
from specscale.model.memory import ModelMemory
from specscale.seam import SamplingParams
from specscale.tokenizer import Tokenizer


@dataclass
class SequenceOutput:
    """What happened to one sequence in one iteration."""

    seq_id: int
    new_token_ids: list[int]
    status: SequenceStatus
    finish_reason: FinishReason | None
    multiplicity: int
    parent_id: int | None = None  # set when this sequence split off parent_id in this iteration (CD)
    lane_ids: tuple[int, ...] = ()  # which of the logical copies given at add / extend this sequence holds
    readouts: torch.Tensor | None = None  # [positions, head_out] once a readout sequence completes


def select_rows(head: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """head [R, out] -> its rows at the increasing indices `rows`; head itself when that is all of them."""
    if len(rows) == head.shape[0]:
        return head
    return head.index_select(0, torch.tensor(rows, device=head.device))


class Engine:
    """See the module docstring. Built from `config` alone, it loads `config.model` (a local Hugging Face
    folder) into a `TorchModelRunner` and reads its tokenizer. Given a `runner` and a `tokenizer`, it runs
    on them instead (the simulator's `SimulatedRunner` and synthetic tokenizer); the KV pool is then the
    runner's, and of the tokenizer the engine reads `token_bytes` and `eos_token_ids` (stop detection)."""

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None, tokenizer=None):
        if (runner is None) != (tokenizer is None):
            raise ValueError("give the engine both a runner and a tokenizer, or neither")
        self.config = config
        self.runner = runner or TorchModelRunner.from_checkpoint(config)
        self.tokenizer = tokenizer or Tokenizer(config.model)
        model_max = self.runner.max_position_embeddings
        self.max_model_len = min(config.max_model_len or model_max, model_max)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.spare_rows)
        self.sampler = Sampler(torch.Generator(device=config.device).manual_seed(config.seed),
                               use_cpu_kernel=self.runner.use_cpu_kernels)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids)
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self._stop_bytes: dict[tuple[str, ...], tuple[tuple[bytes, ...], int]] = {}
        if self.runner.block_size != config.block_size:
            raise ValueError(f"the runner's KV blocks hold {self.runner.block_size} tokens, the config says "
                             f"{config.block_size}")

    @property
    def runner_dtype(self) -> torch.dtype:
        return self.runner.dtype

    def kernels(self) -> dict:
        """The machine and the implementation of every hot path (/health, start-up log, benchmark headers)."""
        return self.runner.kernels()

    def model_memory(self) -> ModelMemory:
        """Bytes the model holds: weights (one copy each), KV pool, RoPE tables (model/memory.py)."""
        return self.runner.memory()

    # ---- requests --------------------------------------------------------------------------
    def add(
        self,
        prompt_ids: list[int],
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        multiplicity: int = 1,
        readout_positions: list[int] | None = None,
        abort_on_preempt: bool = False,
        lane_seeds: tuple[int, ...] | None = None,
    ) -> int:
        """Add a sequence. params=None makes it prefill-only: it returns readouts at readout_positions.
        lane_seeds: one sampling seed per logical copy (default: derived from params.seed)."""
        self._check_new_tokens(0, prompt_ids, params, readout_positions)
        if multiplicity < 1:
            raise ValueError(f"multiplicity must be >= 1, got {multiplicity}")
        seq = Sequence(
            seq_id=next(self._ids),
            token_ids=list(prompt_ids),
            params=params,
            arrival=next(self._arrivals),
            priority=priority,
            multiplicity=multiplicity,
            segment_start=len(prompt_ids),
            lanes=self._lanes_for(params, multiplicity, lane_seeds),
            lane_ids=list(range(multiplicity)),
            abort_on_preempt=abort_on_preempt,
            readout_positions=list(readout_positions or []),
        )
        seq.usage.prompt_tokens = len(prompt_ids)
        self.scheduler.add(seq)
        return seq.seq_id

    def extend(
        self,
        seq_id: int,
        params: SamplingParams | None = None,
        *,
        token_ids: list[int] | tuple[int, ...] = (),
        priority: int | None = None,
        multiplicity: int | None = None,
        readout_positions: list[int] | None = None,
        abort_on_preempt: bool = False,
        lane_seeds: tuple[int, ...] | None = None,
    ) -> None:
        """Start the next segment of a PAUSED sequence, after appending token_ids (e.g. more text).
        A seeded segment (params.seed or lane_seeds) samples the same whatever ran before."""
        seq = self._get_paused(seq_id)
        params = params if params is not None else seq.params
        self._check_new_tokens(len(seq), token_ids, params, readout_positions)
        seq.token_ids += token_ids
        seq.usage.prompt_tokens += len(token_ids)
        seq.params = params
        multiplicity = seq.multiplicity if multiplicity is None else multiplicity
        if lane_seeds is not None or (params is not None and params.seed is not None):
            seq.lanes = self._lanes_for(params, multiplicity, lane_seeds)
        elif multiplicity != len(seq.lanes) and seq.lanes:
            raise ValueError(f"sequence {seq_id} has {len(seq.lanes)} lanes; a multiplicity of {multiplicity} "
                             "needs lane_seeds")
        seq.segment_start = len(seq.token_ids)
        seq.stop_tail = b""
        seq.finish_reason = None
        seq.readout_positions = list(readout_positions or [])
        seq.abort_on_preempt = abort_on_preempt
        seq.priority = seq.priority if priority is None else priority
        seq.multiplicity = multiplicity
        seq.lane_ids = list(range(multiplicity))
        seq.status = SequenceStatus.RUNNING if seq.block_table else SequenceStatus.WAITING

    def fork(self, seq_id: int, n: int, multiplicity: int = 1) -> list[int]:
        """n new sequences sharing all of seq_id's blocks (no copy until one writes a shared block).
        A seeded parent gives each child lanes seeded from draws of its own first lane."""
        parent = self.scheduler.sequences.get(seq_id)
        if parent is None:
            raise KeyError(f"sequence {seq_id} is not live")
        return [self._fork_one(parent, list(range(multiplicity)), self._derived_lanes(parent, multiplicity)).seq_id
                for _ in range(n)]

    def pause(self, seq_id: int) -> bool:
        """Stop a generating sequence where it is, keeping its KV; `extend` resumes it. False if not running."""
        seq = self.scheduler.sequences.get(seq_id)
        if seq is None or seq.is_readout or seq.status not in (SequenceStatus.WAITING, SequenceStatus.RUNNING):
            return False
        seq.status = SequenceStatus.PAUSED
        return True

    def resume(self, seq_id: int, priority: int | None = None, abort_on_preempt: bool = False) -> None:
        """Continue a sequence stopped by `pause` in the same segment (its stop detection carries on)."""
        seq = self._get_paused(seq_id)
        seq.priority = seq.priority if priority is None else priority
        seq.abort_on_preempt = abort_on_preempt
        seq.status = SequenceStatus.RUNNING if seq.block_table else SequenceStatus.WAITING

    def set_priority(self, seq_id: int, priority: int, abort_on_preempt: bool | None = None) -> None:
        """Re-rank a live sequence (e.g. speculative work that became real)."""
        seq = self.scheduler.sequences[seq_id]
        seq.priority = priority
        if abort_on_preempt is not None:
            seq.abort_on_preempt = abort_on_preempt

    def abort(self, seq_id: int) -> bool:
        """Free a sequence's blocks at once; False if it was not live."""
        seq = self.scheduler.sequences.get(seq_id)
        if seq is None:
            return False
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, FinishReason.ABORTED
        self.scheduler.remove(seq)
        return True

    def forget_free_prefixes(self) -> int:
        """Drop the automatic prefix cache's entries for free blocks (block_manager.py); live sequences keep
        theirs. Returns how many blocks it forgot."""
        return self.block_manager.forget_free_prefixes()

    def get(self, seq_id: int) -> Sequence | None:
        return self.scheduler.sequences.get(seq_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    @property
    def num_live_sequences(self) -> int:
        return len(self.scheduler.sequences)

    # ---- one iteration ---------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        batch = self.scheduler.schedule()
        result = self.runner.execute(batch) if not batch.is_empty else None
        return self._update(batch, result)

    def _update(self, batch: ScheduledBatch, result: RunnerOutput | None) -> list[SequenceOutput]:
        outputs = [SequenceOutput(s.seq_id, [], s.status, s.finish_reason, s.multiplicity, lane_ids=tuple(s.lane_ids))
                   for s in batch.aborted]
        sampling: list[Sequence] = []  # generating sequences that reached their last token, in row order
        logit_rows: list[int] = []  # their rows of result.head
        for row, (offset, count) in zip(batch.rows, result.head_rows if result else [], strict=False):
            seq = row.seq
            seq.num_computed_tokens = row.start + row.num_tokens  # row.end
            seq.usage.computed_tokens += row.num_tokens
            self.block_manager.register_computed_blocks(seq)
            if seq.is_readout:
                outputs += self._update_readout(row, result.head[offset : offset + count])
            elif count:
                sampling.append(seq)
                logit_rows.append(offset)
        if sampling:
            outputs += self._sample_and_append(sampling, select_rows(result.head, logit_rows))
        return outputs

    def _update_readout(self, row: ScheduledRow, head: torch.Tensor) -> list[SequenceOutput]:
        seq = row.seq
        if len(head):
            seq.readouts.append(head)
        if not row.reaches_last_token:
            return []
        readouts = torch.cat(seq.readouts) if seq.readouts else None
        seq.readouts = []
        seq.status, seq.finish_reason = SequenceStatus.PAUSED, FinishReason.READOUT
        return [SequenceOutput(seq.seq_id, [], seq.status, seq.finish_reason, seq.multiplicity, readouts=readouts)]

    def _sample_and_append(self, seqs: list[Sequence], logits: torch.Tensor) -> list[SequenceOutput]:
        """logits [R, vocab]: row i is seqs[i]'s next-token logits."""
        draws = self.sampler(logits, [self._sample_row(seq) for seq in seqs])
        outputs = []
        for seq, tokens in zip(seqs, draws, strict=True):
            outputs += self._append_draws(seq, tokens)
        return outputs

    def _sample_row(self, seq: Sequence) -> SampleRow:
        p = seq.params
        return SampleRow(p.temperature, p.top_p, p.top_k, seq.multiplicity, tuple(seq.lanes))

    def _append_draws(self, seq: Sequence, tokens: list[int]) -> list[SequenceOutput]:
        """Group equal draws; the sequence keeps the first group, each other group forks a child that
        takes the lanes of its draws."""
        first = tokens[0]
        if tokens.count(first) == len(tokens):  # one group (every row of multiplicity 1): nothing splits
            self._append_token(seq, first)
            return [SequenceOutput(seq.seq_id, [first], seq.status, seq.finish_reason, seq.multiplicity,
                                   lane_ids=tuple(seq.lane_ids))]
        groups: dict[int, list[int]] = {}  # token -> indices of the draws (lanes) that drew it
        for j, token in enumerate(tokens):
            groups.setdefault(token, []).append(j)
        (first, first_draws), *others = groups.items()
        targets: list[tuple[Sequence, int, int | None]] = [(seq, first, None)]
        for token, draws in others:
            lanes = [seq.lanes[j] for j in draws] if seq.lanes else []
            child = self._fork_one(seq, [seq.lane_ids[j] for j in draws], lanes)
            targets.append((child, token, seq.seq_id))
        seq.multiplicity = len(first_draws)
        seq.lanes = [seq.lanes[j] for j in first_draws] if seq.lanes else []
        seq.lane_ids = [seq.lane_ids[j] for j in first_draws]
        outputs = []
        for target, token, parent_id in targets:
            self._append_token(target, token)
            outputs.append(SequenceOutput(target.seq_id, [token], target.status, target.finish_reason,
                                          target.multiplicity, parent_id, lane_ids=tuple(target.lane_ids)))
        return outputs

    def _append_token(self, seq: Sequence, token: int) -> None:
        seq.token_ids.append(token)
        seq.usage.generated_tokens += 1
        reason = self._stop_reason(seq, token)
        if reason is None:
            return
        seq.finish_reason = reason
        if reason == FinishReason.STOP:
            seq.status = SequenceStatus.PAUSED
        else:
            seq.status = SequenceStatus.FINISHED
            self.scheduler.remove(seq)

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if token in self.eos_token_ids and not params.ignore_eos:
            return FinishReason.EOS
        if params.stop and self._hits_stop_string(seq, token):
            return FinishReason.STOP
        length = len(seq.token_ids)
        if length - seq.segment_start >= params.max_new_tokens:  # seq.num_segment_tokens
            return FinishReason.LENGTH
        if length >= self.max_model_len:
            return FinishReason.CONTEXT
        return None

    def _hits_stop_string(self, seq: Sequence, token: int) -> bool:
        stops, keep = self._stops_of(seq.params.stop)
        text = seq.stop_tail + self.tokenizer.token_bytes[token]  # the segment's newest bytes
        for stop in stops:
            if stop in text:
                return True
        seq.stop_tail = text[-keep:] if keep else b""
        return False

    def _stops_of(self, stop: tuple[str, ...]) -> tuple[tuple[bytes, ...], int]:
        """The stop strings as bytes, and how many trailing bytes catch one split across tokens."""
        entry = self._stop_bytes.get(stop)
        if entry is None:
            stops = tuple(s.encode("utf-8") for s in stop)
            entry = self._stop_bytes[stop] = (stops, max(len(s) for s in stops) - 1)
        return entry

    # ---- helpers ---------------------------------------------------------------------------
    def _fork_one(self, parent: Sequence, lane_ids: list[int], lanes: list[torch.Generator]) -> Sequence:
        child = Sequence(
            seq_id=next(self._ids),
            token_ids=list(parent.token_ids),
            params=parent.params,
            arrival=next(self._arrivals),
            priority=parent.priority,
            multiplicity=len(lane_ids),
            status=parent.status,
            segment_start=parent.segment_start,
            stop_tail=parent.stop_tail,
            lanes=lanes,
            lane_ids=lane_ids,
            abort_on_preempt=parent.abort_on_preempt,
            readout_positions=list(parent.readout_positions),
        )
        self.block_manager.fork(parent, child)
        self.scheduler.add(child)
        return child

    def _lanes_for(self, params: SamplingParams | None, multiplicity: int,
                   lane_seeds: tuple[int, ...] | None) -> list[torch.Generator]:
        """One generator per logical copy: from lane_seeds, else lane 0 from params.seed and the others
        from draws of a generator seeded with it; none for an unseeded (or prefill-only) sequence."""
        if lane_seeds is not None:
            if len(lane_seeds) != multiplicity:
                raise ValueError(f"{len(lane_seeds)} lane seeds for multiplicity {multiplicity}")
            return [self._seeded_generator(seed) for seed in lane_seeds]
        if params is None or params.seed is None:
            return []
        first = self._seeded_generator(params.seed)
        return [first] + self._draw_generators(self._seeded_generator(params.seed), multiplicity - 1)

    def _derived_lanes(self, parent: Sequence, multiplicity: int) -> list[torch.Generator]:
        """Lanes of a child forked off parent: seeded by draws from the parent's first lane."""
        return self._draw_generators(parent.lanes[0], multiplicity) if parent.lanes else []

    def _draw_generators(self, source: torch.Generator, count: int) -> list[torch.Generator]:
        draws = torch.randint(0, 2**62, (count,), generator=source, device=source.device).tolist()
        return [self._seeded_generator(seed) for seed in draws]

    def _seeded_generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.config.device).manual_seed(seed)

    def _get_paused(self, seq_id: int) -> Sequence:
        seq = self.scheduler.sequences.get(seq_id)
        if seq is None or seq.status != SequenceStatus.PAUSED:
            state = "not live" if seq is None else seq.status.value
            raise ValueError(f"sequence {seq_id} cannot be extended: it is {state}, not paused")
        return seq

    def _check_new_tokens(self, current: int, token_ids, params, readout_positions) -> None:
        total = current + len(token_ids)
        if total == 0:
            raise ValueError("a sequence needs at least one token")
        if total >= self.max_model_len and params is not None:
            raise ValueError(f"sequence of {total} tokens leaves no room under max_model_len={self.max_model_len}")
        if total > self.max_model_len:
            raise ValueError(f"sequence of {total} tokens exceeds max_model_len={self.max_model_len}")
        if params is None and not readout_positions:
            raise ValueError("a prefill-only sequence (params=None) needs readout_positions")
        if params is None and not token_ids and current:
            raise ValueError("extending a prefill-only sequence needs new token_ids")
        bad = [p for p in readout_positions or [] if not current <= p < total]
        if bad:
            raise ValueError(f"readout positions {bad[:4]} are outside the new tokens [{current}, {total})")
        vocab = self.runner.vocab_size
        if any(not 0 <= t < vocab for t in token_ids):
            raise ValueError(f"token ids must lie in [0, {vocab})")
