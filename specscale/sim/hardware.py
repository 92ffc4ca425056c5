"""HardwareProfile: one device as the cost model sees it, every number with its source.

Bundled profiles live in `specscale/sim/data/hardware/<name>.json` (A100-80GB, H100-80GB, H200 from their
datasheets; `cpu` fitted from this project's own measurements by `specscale.sim.cpu_fit`). Each file holds
the fields below and a `sources` object naming where each number comes from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

HARDWARE_DIR = Path(__file__).parent / "data" / "hardware"


@dataclass(frozen=True)
class HardwareProfile:
    """peak_flops: dense bf16 FLOP/s; memory_bandwidth: bytes/s; memory_bytes: device memory.
    compute_efficiency / bandwidth_efficiency: achievable fractions of those peaks.
    iteration_fixed_s: fixed cost of a generator iteration; prm_iteration_fixed_s: of a PRM iteration
    (one batch of readouts); row_overhead_s: host cost per row of a generator iteration;
    sequence_overhead_s: host cost per live sequence (scheduled or not) of a generator iteration, 0 where
    the profile folds it into the other two (files without the field read as 0).
    memory_utilization: share of memory_bytes the two engines may take; reserved_bytes: of that, what
    activations and workspaces keep (the rest after both models' weights is KV cache)."""

    name: str
    description: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float
    compute_efficiency: float
    bandwidth_efficiency: float
    iteration_fixed_s: float
    prm_iteration_fixed_s: float
    row_overhead_s: float
    memory_utilization: float
    reserved_bytes: float
    sequence_overhead_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "memory_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.name}: {name} must be positive")
        for name in ("compute_efficiency", "bandwidth_efficiency", "memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{self.name}: {name} must be in (0, 1]")
        for name in ("iteration_fixed_s", "prm_iteration_fixed_s", "row_overhead_s", "sequence_overhead_s",
                     "reserved_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")

    @property
    def achievable_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_efficiency

    @classmethod
    def from_json(cls, data: dict) -> HardwareProfile:
        return cls(**data)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def load(cls, name_or_path: str) -> HardwareProfile:
        """A bundled profile by name (`bundled_hardware()`), or a profile JSON path."""
        bundled = HARDWARE_DIR / f"{name_or_path}.json"
        path = bundled if bundled.is_file() else Path(name_or_path)
        if not path.is_file():
            raise FileNotFoundError(f"no hardware profile {name_or_path!r}: neither a bundled one "
                                    f"({', '.join(bundled_hardware())}) nor a JSON file")
        return cls.from_json(json.loads(path.read_text()))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def bundled_hardware() -> list[str]:
    return sorted(p.stem for p in HARDWARE_DIR.glob("*.json"))
