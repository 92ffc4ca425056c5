"""MachineFingerprint: what decides which kernel is fastest here: CPU model, ISA flags, threads, torch version
(and the OpenMP wait policy: waking sleeping threads costs a small call tens of microseconds).

The ISA flags are the ones a kernel path depends on (AVX2 / AVX-512 / AVX512-BF16 / AMX ...), read from
/proc/cpuinfo. `SPECSCALE_CPU_ISA=avx2` makes the process behave as on an AVX2-only CPU: the flags above
AVX2 are dropped here, the C++ kernels compile for x86-64-v3 (model/cpu_kernels.py), and oneDNN should be
capped the same way (`ONEDNN_MAX_CPU_ISA=AVX2` before the process starts). Tests force the dispatch so.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "avx_ne_convert", "amx_tile", "amx_bf16", "amx_int8")
AVX2_FLAGS = ("avx2", "fma", "f16c")
FORCED_ISAS = ("avx2",)


def forced_isa() -> str | None:
    """"avx2" when SPECSCALE_CPU_ISA asks this process to run as on an AVX2-only CPU, else None."""
    forced = os.environ.get("SPECSCALE_CPU_ISA", "").lower()
    if forced and forced not in FORCED_ISAS:
        raise ValueError(f"SPECSCALE_CPU_ISA must be one of {FORCED_ISAS}, got {forced!r}")
    return forced or None


def _cpuinfo_lines() -> list[str]:
    path = Path("/proc/cpuinfo")
    return path.read_text().splitlines() if path.is_file() else []


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers, e.g. "Intel(R) Xeon(R) Processor (family 6
    model 167)": a virtual machine's name can be as generic as that, the numbers tell the CPUs apart."""
    fields: dict[str, str] = {}
    for line in _cpuinfo_lines():
        if not line.strip():
            break  # the first processor's fields only
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    numbers = " ".join(f"{key.split()[-1]} {fields[key]}" for key in ("cpu family", "model") if key in fields)
    return f"{name} ({numbers})" if numbers else name


def isa_flags() -> tuple[str, ...]:
    """The kernel-relevant ISA flags of this CPU (ISA_FLAGS order), capped at AVX2 under SPECSCALE_CPU_ISA."""
    present: set[str] = set()
    for line in _cpuinfo_lines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            break
    allowed = AVX2_FLAGS if forced_isa() == "avx2" else ISA_FLAGS
    return tuple(flag for flag in ISA_FLAGS if flag in present and flag in allowed)


@dataclass(frozen=True)
class MachineFingerprint:
    cpu: str
    isa_flags: tuple[str, ...]
    threads: int
    torch_version: str
    omp_wait_policy: str = ""

    @classmethod
    def current(cls) -> MachineFingerprint:
        return cls(cpu_model(), isa_flags(), torch.get_num_threads(), torch.__version__,
                   os.environ.get("OMP_WAIT_POLICY", "").upper())

    @property
    def key(self) -> str:
        """A short stable hash of every field (the name of this machine's kernel-choice cache file)."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def has(self, flag: str) -> bool:
        return flag in self.isa_flags

    @property
    def has_amx(self) -> bool:
        return self.has("amx_tile") and self.has("amx_bf16")

    def describe(self) -> str:
        """E.g. "AMD EPYC, 2 threads, torch 2.13.0+cpu, ISA avx2 fma ... avx512_bf16 (no AMX)"."""
        amx = "AMX" if self.has_amx else "no AMX"
        forced = f", forced to {forced_isa()}" if forced_isa() else ""
        return (f"{self.cpu}, {self.threads} threads, torch {self.torch_version}, ISA {' '.join(self.isa_flags)} "
                f"({amx}{forced})")
