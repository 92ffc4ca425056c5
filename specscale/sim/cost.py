"""The cost model: seconds of one engine iteration, and the KV capacity left after the weights.

One device runs both models, time-shared: the search runtime runs either a generator iteration or a PRM
batch per tick, so the simulated clock simply adds their times. The roofline of one iteration:

    tokens  T = decode rows + prefill tokens
    FLOPs   F = body_flops_per_token * T + head_flops_per_row * head rows
                + attention_flops_per_key * (sum over decode rows of their context
                                             + sum over prefill chunks of n*c + n*(n+1)/2)
    bytes   B = body weights + head weights (when any head row runs)
                + kv_bytes_per_token * (sum of decode contexts + sum over chunks of (c + n) + T)
    seconds = fixed(role) + host + max(F / achievable FLOP/s, B / achievable bytes/s)

with n the chunk's new tokens and c the tokens cached before it: a decode row attends to its whole
context and reads its KV; a prefill chunk's token i attends to c + i keys, and the chunk reads the cached
KV once (flash attention); every new token writes its KV. Embedding gathers, norms and activations are
left out (under 1% of either term for these models). `fixed(role)` is the hardware's
iteration_fixed_s for the generator and prm_iteration_fixed_s for a PRM batch; `host` is, for a generator
iteration, rows x row_overhead_s (sampling, stop detection and bookkeeping per row) + live sequences x
sequence_overhead_s (the scheduler's scan and the search's bookkeeping over every sequence the engine
holds, scheduled or not: speculative and paused ones too), 0 for the PRM. On the CPU both host terms are
fitted from `specscale bench characterize` (docs/simulator.md, "The CPU profile").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from specscale.engine.scheduler import ScheduledBatch
from specscale.sim.hardware import HardwareProfile
from specscale.sim.model_profile import ModelProfile

ROLES = ("generator", "prm")


@dataclass(frozen=True)
class IterationWork:
    """What one engine iteration computes: decode_contexts[i] is decode row i's context length including
    its new token; prefill_chunks[j] = (new tokens, tokens cached before them); head_rows: head outputs;
    live_sequences: the sequences the engine holds while it runs (the rows' and any waiting or paused)."""

    decode_contexts: tuple[int, ...] = ()
    prefill_chunks: tuple[tuple[int, int], ...] = ()
    head_rows: int = 0
    live_sequences: int = 0

    @classmethod
    def from_batch(cls, batch: ScheduledBatch, head_rows: int, live_sequences: int) -> IterationWork:
        return cls(tuple(row.end for row in batch.decode_rows),
                   tuple((row.num_tokens, row.start) for row in batch.prefill_rows), head_rows, live_sequences)

    @property
    def num_rows(self) -> int:
        return len(self.decode_contexts) + len(self.prefill_chunks)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_contexts) + sum(n for n, _ in self.prefill_chunks)

    @property
    def attended_keys(self) -> int:
        """(query, key) pairs of causal attention over the iteration."""
        return sum(self.decode_contexts) + sum(n * c + n * (n + 1) // 2 for n, c in self.prefill_chunks)

    @property
    def kv_tokens_read(self) -> int:
        return sum(self.decode_contexts) + sum(c + n for n, c in self.prefill_chunks)


class CostModel(ABC):
    """The seam between simulated runners and a device: what an iteration of a model costs."""

    @abstractmethod
    def iteration_seconds(self, model: ModelProfile, work: IterationWork, role: str) -> float:
        """Seconds of one iteration of `model` computing `work`; role is "generator" or "prm"."""


class RooflineCostModel(CostModel):
    """The module docstring's roofline on one `HardwareProfile`."""

    def __init__(self, hardware: HardwareProfile):
        self.hardware = hardware

    def iteration_seconds(self, model: ModelProfile, work: IterationWork, role: str) -> float:
        hw = self.hardware
        compute_s = flops(model, work) / hw.achievable_flops
        memory_s = bytes_moved(model, work) / hw.achievable_bandwidth
        return fixed_seconds(hw, role) + host_seconds(hw, work, role) + max(compute_s, memory_s)


def flops(model: ModelProfile, work: IterationWork) -> float:
    return (model.body_flops_per_token * work.num_tokens + model.head_flops_per_row * work.head_rows
            + model.attention_flops_per_key * work.attended_keys)


def bytes_moved(model: ModelProfile, work: IterationWork) -> float:
    weights = model.body_weight_bytes + (model.head_weight_bytes if work.head_rows else 0)
    return weights + model.kv_bytes_per_token * (work.kv_tokens_read + work.num_tokens)


def host_seconds(hardware: HardwareProfile, work: IterationWork, role: str) -> float:
    """The host's share of a generator iteration: per row and per live sequence; none for the PRM."""
    if role != "generator":
        return 0.0
    return work.num_rows * hardware.row_overhead_s + work.live_sequences * hardware.sequence_overhead_s


def fixed_seconds(hardware: HardwareProfile, role: str) -> float:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return hardware.iteration_fixed_s if role == "generator" else hardware.prm_iteration_fixed_s


@dataclass(frozen=True)
class KVCapacity:
    generator_blocks: int
    prm_blocks: int


def kv_capacity(hardware: HardwareProfile, generator: ModelProfile, prm: ModelProfile, block_size: int,
                prm_share: float) -> KVCapacity:
    """KV blocks of each engine: the usable memory after both models' weights and the reserve, split
    prm_share to the PRM and the rest to the generator."""
    if not 0 < prm_share < 1:
        raise ValueError(f"prm_share must be in (0, 1), got {prm_share}")
    usable = hardware.memory_bytes * hardware.memory_utilization - hardware.reserved_bytes
    free = usable - generator.weight_bytes - prm.weight_bytes
    if free <= 0:
        raise ValueError(f"{generator.name} ({generator.weight_bytes / 2**30:.1f} GiB) and {prm.name} "
                         f"({prm.weight_bytes / 2**30:.1f} GiB) leave no KV cache in {usable / 2**30:.1f} GiB "
                         f"of {hardware.name}")
    generator_blocks = int(free * (1 - prm_share)) // generator.kv_bytes_per_block(block_size)
    prm_blocks = int(free * prm_share) // prm.kv_bytes_per_block(block_size)
    return KVCapacity(max(generator_blocks, 1), max(prm_blocks, 1))
