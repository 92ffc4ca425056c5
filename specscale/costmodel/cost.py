"""The cost model: seconds of one engine iteration, and the KV capacity left after the weights.

One device runs both models, time-shared: the search runtime runs either a generator iteration or a PRM
batch per tick, so the simulated clock simply adds their times. An iteration runs its kernels one after
another, so each phase sits on its own roofline and the phases add (docs/simulator.md, "The cost model"):

    tokens     T = decode rows + prefill tokens
    GEMMs      max(body FLOPs / gemm_rate(T, hidden) + head FLOPs / gemm_rate(head rows, head columns),
                   (body weights + head weights when any head row runs) / achievable bytes/s)
    attention  max(attention_flops_per_key * (sum over decode rows of their context
                                              + sum over prefill chunks of n*c + n*(n+1)/2) / achievable FLOP/s,
                   kv_bytes_per_token * (sum of decode contexts + sum over chunks of (c + n) + T) / achievable bytes/s)
    kernels    layers x layer_kernel_s
    seconds  = fixed(role) + host + GEMMs + attention + kernels

with n the chunk's new tokens and c the tokens cached before it: a decode row attends to its whole
context and reads its KV; a prefill chunk's token i attends to c + i keys, and the chunk reads the cached
KV once (flash attention); every new token writes its KV. gemm_rate(M, N) is `HardwareProfile.gemm_flop_rate`:
a GEMM's achieved FLOP/s rises with its rows M as its output tiles fill the multiprocessors (constant on
a profile without multiprocessors). `layer_kernel_s` is the device time per layer of the kernels neither
roofline carries (norms, rotary, activation, residual adds, KV writes and each kernel's ramp), measured on
a GPU by benchmarks/gpu_cost_probe.py (0 on the CPU profile, whose fit folds them into its fixed costs).
A single roofline over the whole iteration (max of the summed FLOPs and summed bytes) let a decode's KV
reads hide behind its GEMMs; the H200 probe shows they do not (docs/bench/gpu-cost-model.md, "The GPU cost model,
measured"), so the GPU profiles set `phase_rooflines`. The CPU profile keeps the single roofline: its fit
(specscale_lab/calibration/cpu_fit.py) and its validation against real runs were made with it, and the toy
models' weights and KV sit in the CPU's caches, so its bandwidth is not a DRAM figure a phase could bind on.
`fixed(role)` is the hardware's iteration_fixed_s for the generator and prm_iteration_fixed_s for a PRM
batch; `host` is, for a generator iteration, rows x row_overhead_s (sampling, stop detection and
bookkeeping per row) + live sequences x sequence_overhead_s (the scheduler's scan and the search's
bookkeeping over every sequence the engine holds, scheduled or not: speculative and paused ones too); for a
PRM batch, prm_token_overhead_s per input token of every scored sequence (c + n:
the PRM input is tokenised whole for every call). On the CPU the host terms are fitted from `specscale
bench characterize` (docs/simulator.md, "The CPU profile").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from specscale.costmodel.hardware import HardwareProfile
from specscale.costmodel.model_profile import ModelProfile
from specscale.engine.scheduler import ScheduledBatch

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
        return fixed_seconds(hw, role) + host_seconds(hw, work, role) + device_seconds(hw, model, work)


def device_seconds(hardware: HardwareProfile, model: ModelProfile, work: IterationWork) -> float:
    """The module docstring's GEMM and attention phases, each on its roofline, and the per-layer kernels; on a
    profile without `phase_rooflines` (the CPU's), one roofline over the whole iteration."""
    kernels = model.num_layers * hardware.layer_kernel_s
    if not hardware.phase_rooflines:
        compute = compute_seconds(hardware, model, work) + attention_compute_seconds(hardware, model, work)
        return kernels + max(compute, bytes_moved(model, work) / hardware.achievable_bandwidth)
    return gemm_seconds(hardware, model, work) + attention_seconds(hardware, model, work) + kernels


def gemm_seconds(hardware: HardwareProfile, model: ModelProfile, work: IterationWork) -> float:
    return max(compute_seconds(hardware, model, work), weight_bytes(model, work) / hardware.achievable_bandwidth)


def attention_seconds(hardware: HardwareProfile, model: ModelProfile, work: IterationWork) -> float:
    return max(attention_compute_seconds(hardware, model, work), kv_bytes(model, work) / hardware.achievable_bandwidth)


def attention_compute_seconds(hardware: HardwareProfile, model: ModelProfile, work: IterationWork) -> float:
    """Attention's FLOPs at the saturated rate."""
    return model.attention_flops_per_key * work.attended_keys / hardware.achievable_flops


def flops(model: ModelProfile, work: IterationWork) -> float:
    return (model.body_flops_per_token * work.num_tokens + model.head_flops_per_row * work.head_rows
            + model.attention_flops_per_key * work.attended_keys)


def compute_seconds(hardware: HardwareProfile, model: ModelProfile, work: IterationWork) -> float:
    """The body's and the head's GEMMs at their rows' achieved rate."""
    body = model.body_flops_per_token * work.num_tokens / hardware.gemm_flop_rate(work.num_tokens, model.hidden_size)
    return body + model.head_flops_per_row * work.head_rows / hardware.gemm_flop_rate(work.head_rows,
                                                                                        head_columns(model))


def head_columns(model: ModelProfile) -> int:
    """Output columns of the head's (first) GEMM: the vocabulary, or a score head's hidden layer."""
    return model.vocab_size if model.head == "lm" else model.hidden_size


def weight_bytes(model: ModelProfile, work: IterationWork) -> float:
    """The weights the GEMMs read once per iteration: the body's, and the head's when any head row runs."""
    return model.body_weight_bytes + (model.head_weight_bytes if work.head_rows else 0)


def kv_bytes(model: ModelProfile, work: IterationWork) -> float:
    """The KV attention reads (every row's cached context) and writes (every new token's)."""
    return model.kv_bytes_per_token * (work.kv_tokens_read + work.num_tokens)


def bytes_moved(model: ModelProfile, work: IterationWork) -> float:
    return weight_bytes(model, work) + kv_bytes(model, work)


def host_seconds(hardware: HardwareProfile, work: IterationWork, role: str) -> float:
    """The host's share of an iteration beyond its fixed part: a generator iteration's per row and per live
    sequence, a PRM call's per input token (every scored sequence's whole input, re-tokenised)."""
    if role == "prm":
        return prm_input_tokens(work) * hardware.prm_token_overhead_s
    return work.num_rows * hardware.row_overhead_s + work.live_sequences * hardware.sequence_overhead_s


def prm_input_tokens(work: IterationWork) -> int:
    """Tokens of the sequences a PRM call scores, their cached prefixes included."""
    return sum(c + n for n, c in work.prefill_chunks) + sum(work.decode_contexts)


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
