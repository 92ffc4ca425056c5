"""Sequence: one row of the engine — its tokens, how many of them have KV, its block table and state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from specscale.seam import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # has tokens without KV and holds no blocks yet (new or preempted)
    RUNNING = "running"  # has tokens without KV; scheduled each iteration it fits
    PAUSED = "paused"  # stopped at a stop string (or a readout finished); keeps its KV until extended
    FINISHED = "finished"  # ended; its blocks are released


class FinishReason(enum.Enum):
    STOP = "stop"  # a stop string ended the segment (the sequence is paused, not finished)
    EOS = "eos"
    LENGTH = "length"  # max_new_tokens of the segment reached
    CONTEXT = "context"  # max_model_len reached
    READOUT = "readout"  # a prefill-only sequence computed all its tokens
    ABORTED = "aborted"
    PREEMPTED = "preempted"  # aborted because it was preempted and asked not to be resumed


@dataclass
class Usage:
    prompt_tokens: int = 0  # tokens given to the engine (prompt, appended text)
    computed_tokens: int = 0  # tokens run through the model, recomputation included
    generated_tokens: int = 0  # tokens sampled

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.computed_tokens += other.computed_tokens
        self.generated_tokens += other.generated_tokens


@dataclass(eq=False)
class Sequence:
    """Invariants: num_computed_tokens <= len(token_ids); the block table covers exactly
    ceil(num_computed_tokens / block_size) blocks after each iteration; a PAUSED or RUNNING generating
    sequence has exactly one token without KV (the last sampled one) once its prompt is computed."""

    seq_id: int
    token_ids: list[int]
    params: SamplingParams | None  # None for prefill-only (readout) sequences
    arrival: int  # monotonic; larger = newer
    priority: int = 0  # higher runs first; speculative work runs at lower priority
    multiplicity: int = 1  # logical candidates this physical sequence stands for (CD)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_hashed_blocks: int = 0  # leading full blocks already registered in the prefix cache
    block_table: list[int] = field(default_factory=list)
    segment_start: int = 0  # index of the first token of the current generation segment
    stop_tail: bytes = b""  # last bytes of the segment's text, for stop strings spanning tokens
    finish_reason: FinishReason | None = None
    lanes: list[torch.Generator] = field(default_factory=list)  # seeded: one generator per logical copy
    lane_ids: list[int] = field(default_factory=lambda: [0])  # the logical copies it holds (indices at add / extend)
    abort_on_preempt: bool = False
    readout_positions: list[int] = field(default_factory=list)  # prefill-only: positions to read
    readouts: list[torch.Tensor] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def num_segment_tokens(self) -> int:
        return len(self.token_ids) - self.segment_start

    @property
    def is_readout(self) -> bool:
        return self.params is None

    @property
    def is_schedulable(self) -> bool:
        return self.status in (SequenceStatus.WAITING, SequenceStatus.RUNNING) and self.num_uncomputed_tokens > 0
