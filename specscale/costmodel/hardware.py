"""HardwareProfile: one device as the cost model sees it, every number with its source.

Bundled profiles live in `specscale/costmodel/data/hardware/<name>.json` (A100-80GB, H100-80GB, H200 from their
datasheets; `cpu` fitted from this project's own measurements by `specscale_lab.calibration.cpu_fit`). Each file holds
the fields below and a `sources` object naming where each number comes from.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

HARDWARE_DIR = Path(__file__).parent / "data" / "hardware"
GEMM_TILE_COLUMNS = 128  # the output tile of cuBLAS / CUTLASS bf16 GEMMs on Ampere and Hopper: 128 x 128,
GEMM_TILE_ROWS = (16, 128)  # a GEMM of fewer rows takes tiles of as many rows (skinny tiles), 16 at least


@dataclass(frozen=True)
class HardwareProfile:
    """peak_flops: dense bf16 FLOP/s; memory_bandwidth: bytes/s; memory_bytes: device memory.
    compute_efficiency / bandwidth_efficiency: achievable fractions of those peaks; compute_efficiency is
    what a GEMM of many rows reaches (the saturated end of the curve below).
    multiprocessors / gemm_half_wave: a GEMM's efficiency rises with its rows M as its 128 x 128 output
    tiles fill the device's multiprocessors: efficiency(M) = compute_efficiency x M / (M + M_half) with
    M_half = gemm_half_wave x multiprocessors x tile rows x 128 / N for an N-column output, the tile's rows
    M clamped to 16..128 (docs/simulator.md, "GEMM efficiency"); 0 multiprocessors
    (the CPU profile) keeps the efficiency constant.
    iteration_fixed_s: fixed cost of a generator iteration; prm_iteration_fixed_s: of a PRM iteration
    (one batch of readouts: scheduling, launches and the readout's host work, not hidden behind the GPU);
    prm_token_overhead_s: host cost per PRM input token of a call (re-tokenising every scored sequence's
    whole input, its cached prefix included); row_overhead_s: host cost per row of a generator iteration;
    sequence_overhead_s: host cost per live sequence (scheduled or not) of a generator iteration, 0 where
    the profile folds it into the other two (files without the field read as 0).
    layer_kernel_s: device time per layer of an iteration's kernels that neither the GEMM nor the attention
    roofline carries (norms, rotary, activation, residual adds, KV writes, kernel ramps); 0 where the profile
    folds them into its fixed costs (the CPU's; files without the field read as 0).
    phase_rooflines: the GEMM and attention phases each on their own roofline, their times added (measured on
    a GPU, docs/simulator.md "The cost model"); False keeps one roofline over the whole iteration, as the CPU
    profile was fitted and validated (files without the field read as False).
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
    multiprocessors: int = 0
    gemm_half_wave: float = 0.0
    prm_token_overhead_s: float = 0.0
    layer_kernel_s: float = 0.0
    phase_rooflines: bool = False
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "memory_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{self.name}: {name} must be positive")
        for name in ("compute_efficiency", "bandwidth_efficiency", "memory_utilization"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{self.name}: {name} must be in (0, 1]")
        for name in ("iteration_fixed_s", "prm_iteration_fixed_s", "row_overhead_s", "sequence_overhead_s",
                     "reserved_bytes", "multiprocessors", "gemm_half_wave", "prm_token_overhead_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{self.name}: {name} must be >= 0")

    @property
    def achievable_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        return self.memory_bandwidth * self.bandwidth_efficiency

    def gemm_half_rows(self, rows: int, output_columns: int) -> float:
        """M_half of a GEMM of `rows` rows and `output_columns` columns: its efficiency is half of
        compute_efficiency where its rows are M_half."""
        tile_rows = min(max(rows, GEMM_TILE_ROWS[0]), GEMM_TILE_ROWS[1])
        return self.gemm_half_wave * self.multiprocessors * tile_rows * GEMM_TILE_COLUMNS / output_columns

    def gemm_flop_rate(self, rows: int, output_columns: int) -> float:
        """Achieved FLOP/s of a GEMM of `rows` rows and `output_columns` columns (the saturating curve)."""
        half = self.gemm_half_rows(rows, output_columns)
        return self.achievable_flops * rows / (rows + half) if rows else self.achievable_flops

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
