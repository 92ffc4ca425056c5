"""SimulatedRunner: the engine's model runner with synthetic outputs and a simulated clock.

The real engine schedules, allocates and frees KV blocks, samples and detects stops exactly as it does on
a model; the runner replaces only the forward pass: it prices the batch with a `CostModel`, advances the
virtual clock by that, and returns head outputs from a `HeadModel` (the workload's next-token logits for
the generator, score readouts for the PRM). No KV tensors exist; the block manager's accounting of them is
the real one, so KV pressure and preemption behave as on the device.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from specscale.costmodel.cost import CostModel, IterationWork
from specscale.costmodel.model_profile import ModelProfile
from specscale.engine.model_runner import ModelRunner, RunnerOutput, head_layout
from specscale.engine.scheduler import ScheduledBatch
from specscale.engine.sequence import Sequence
from specscale.sim.clock import VirtualClock


class HeadModel(ABC):
    """What a simulated model outputs: head rows for (sequence, position) pairs. The output at a position
    may depend only on the sequence's tokens up to and including it (a causal model)."""

    head_size: int

    @abstractmethod
    def outputs(self, items: list[tuple[Sequence, int]]) -> torch.Tensor:
        """[len(items), head_size] float32 head outputs, one row per (sequence, position)."""


class SimulatedRunner(ModelRunner):
    """`profile` prices each iteration on `cost_model` in the given role ("generator" or "prm");
    live_sequences() counts the sequences its engine holds (the cost model's per-sequence host term)."""

    def __init__(self, profile: ModelProfile, head_model: HeadModel, cost_model: CostModel, clock: VirtualClock,
                 role: str, num_blocks: int, block_size: int, vocab_size: int, live_sequences: Callable[[], int]):
        self.profile, self.head_model, self.cost_model = profile, head_model, cost_model
        self.live_sequences = live_sequences
        self.clock, self.role = clock, role
        self.num_blocks, self.block_size = num_blocks, block_size
        self.vocab_size = vocab_size
        self.head_size = head_model.head_size
        self.max_position_embeddings = profile.max_position_embeddings
        self.kv_bytes_per_block = profile.kv_bytes_per_block(block_size)
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.use_cpu_kernels = False
        self.busy_s = 0.0  # simulated seconds this runner has taken
        self.iterations = 0

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        positions, layout = head_layout(batch)
        items = [(row.seq, p) for row, wanted in zip(batch.rows, positions, strict=True) for p in wanted]
        work = IterationWork.from_batch(batch, len(items), self.live_sequences())
        seconds = self.cost_model.iteration_seconds(self.profile, work, self.role)
        self.clock.advance(seconds)
        self.busy_s += seconds
        self.iterations += 1
        head = self.head_model.outputs(items) if items else torch.empty((0, self.head_size))
        return RunnerOutput(head, layout)  # head [R, head_size]
