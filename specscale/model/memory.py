"""ModelMemory: the bytes one loaded model holds (weights, KV pool, RoPE tables) and the process's RSS.

Weights are counted once per storage, so a tied LM head is not counted twice; a prepacked
weight (model/linear.py `Linear`: oneDNN's opaque tensor, or our bf16 layout) counts as its element
count times its element size. `specscale serve` logs these figures at start-up and serves
them in /health (docs/bench/real-size.md has the measured figures).
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MIB = 2**20


@dataclass(frozen=True)
class ModelMemory:
    """Bytes one model holds on its device."""

    weight_bytes: int  # parameters, buffers and prepacked weights, each storage once
    kv_cache_bytes: int  # the paged KV pool, allocated in full at start-up
    rope_table_bytes: int  # the cos / sin tables of every position
    device: str

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes + self.rope_table_bytes

    def as_dict(self) -> dict:
        return {"device": self.device, "weights_mib": _mib(self.weight_bytes),
                "kv_cache_mib": _mib(self.kv_cache_bytes), "rope_tables_mib": _mib(self.rope_table_bytes),
                "total_mib": _mib(self.total_bytes)}

    def describe(self) -> str:
        return (f"{_mib(self.total_bytes):,.0f} MiB on {self.device} (weights {_mib(self.weight_bytes):,.0f}, "
                f"KV pool {_mib(self.kv_cache_bytes):,.0f}, RoPE tables {_mib(self.rope_table_bytes):,.1f})")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters, buffers and prepacked linear weights, each storage counted once."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        total += _storage_bytes_once(tensor, seen)
    for module in model.modules():
        for packed in (getattr(module, "packed", None), getattr(module, "packed_bf16", None)):
            if packed is not None:
                total += packed.numel() * packed.element_size()
    return total


def tensors_bytes(tensors) -> int:
    """Bytes of the given tensors' storages, each storage counted once."""
    seen: set[int] = set()
    return sum(_storage_bytes_once(tensor, seen) for tensor in tensors)


def _storage_bytes_once(tensor: torch.Tensor, seen: set[int]) -> int:
    storage = tensor.untyped_storage()
    if storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


def process_resident_bytes() -> int:
    """The process's resident set size now (Linux /proc); elsewhere its peak so far (getrusage)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024  # reported in kB
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def _mib(n: int) -> float:
    return round(n / MIB, 1)
