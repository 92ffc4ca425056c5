"""ModelRunner: the seam between the engine and a model.

The engine (scheduler, block manager, sampler, stop detection) never touches weights or a device: each
iteration it hands its scheduled batch to a runner and gets back the head outputs of the rows that need
one. Two runners implement it:

- `specscale.engine.torch_runner.TorchModelRunner`: a Qwen2 / Llama checkpoint on its paged KV pool (CPU or CUDA);
- `specscale.sim.runner.SimulatedRunner`: synthetic head outputs from a workload model and a virtual clock
  advanced by a cost model, so the real engine runs "any model on any device" in simulated time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specscale.engine.scheduler import ScheduledBatch, ScheduledRow
from specscale.model.memory import ModelMemory


@dataclass
class RunnerOutput:
    head: torch.Tensor  # [R, head_size] head outputs of the selected rows, in row order
    head_rows: list[tuple[int, int]]  # per scheduled row: (offset into head, count); count 0 = none


class ModelRunner(ABC):
    """One forward pass per scheduled batch, and the facts the engine sizes itself by.

    Attributes every runner sets:
        num_blocks: KV blocks its pool holds (the engine's block manager hands out exactly these).
        block_size: tokens per KV block.
        vocab_size: token ids the model accepts are [0, vocab_size).
        head_size: outputs per head row: vocabulary logits (an LM head; sampled ids are column indices)
            or 2 (a PRM's 2-class score head).
        max_position_embeddings: the model's context.
        kv_bytes_per_block: bytes one KV block takes (keys and values of every layer).
        device, dtype: where and in what dtype head outputs are returned.
        use_cpu_kernels: the sampler may use the C++ CPU kernels.
    """

    num_blocks: int
    block_size: int
    vocab_size: int
    head_size: int
    max_position_embeddings: int
    kv_bytes_per_block: int
    device: torch.device
    dtype: torch.dtype
    use_cpu_kernels: bool

    @abstractmethod
    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        """Compute the batch's new tokens (writing their KV) and return the head outputs at every
        row's `head_positions`, rows in `batch.rows` order."""

    def kernels(self) -> dict:
        """Which implementation each hot path runs here and on what machine (model/kernel_choice.py `report`,
        plus attention); a runner without real kernels (the simulator's) runs none."""
        return {}

    def memory(self) -> ModelMemory:
        """The bytes this runner holds on its device. A runner without real tensors (the simulator's
        virtual model and KV pool) holds none."""
        return ModelMemory(weight_bytes=0, kv_cache_bytes=0, rope_table_bytes=0, device=str(self.device))


def head_positions(row: ScheduledRow) -> list[int]:
    """Positions of row's sequence whose head output this iteration returns: the requested readouts
    inside the row's span for a prefill-only sequence; the last token for a generating sequence that
    reaches it (its next-token logits)."""
    seq, end = row.seq, row.start + row.num_tokens  # row.end, read once (this runs for every row)
    if seq.is_readout:
        return [p for p in seq.readout_positions if row.start <= p < end]
    return [end - 1] if end == len(seq.token_ids) else []


def head_layout(batch: ScheduledBatch) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """(head positions per row, (offset into the head output, count) per row), rows in batch order."""
    positions, layout, offset = [], [], 0
    for row in batch.rows:
        wanted = head_positions(row)
        positions.append(wanted)
        layout.append((offset, len(wanted)))
        offset += len(wanted)
    return positions, layout
