"""KernelChoice: which path every linear runs on this machine, chosen by measurement, cached per machine.

The fastest GEMM depends on the CPU: on an AMD EPYC with AVX512-BF16 and no AMX our bf16 kernel streams the
weights of a decode step faster than oneDNN, on an Intel Xeon with AMX oneDNN's AMX kernels are several times
faster than ours (docs/BENCHMARKS.md, "Real-size models"). So no fixed rule: the paths of a linear
(model/transformer.py `Linear`, LINEAR_PATHS) are timed on this machine for each weight shape at each row
bucket the engine runs (ROW_BUCKETS for a generator: decode batches and prefill chunks; PREFILL_BUCKETS for
a PRM, which only prefills), on weights evicted from the caches first (a decode step streams every weight
from memory). The timings are cached in a JSON file named by the machine's fingerprint (model/machine.py:
CPU model, ISA flags, threads, torch version) beside the compiled C++ extension, so a later start on the
same machine measures nothing.

A weight has one layout (one copy in memory), so it takes one path for every row count: the one whose time,
relative to the fastest path of each bucket, has the smallest geometric mean over the buckets (with one
bucket, simply the fastest; the per-bucket winners are reported beside it). `mode` other than "auto"
forces a path where it can run (KERNEL_MODES; EngineConfig.kernels, `--kernels`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from specscale.config import KERNEL_MODES
from specscale.model import cpu_kernels
from specscale.model.machine import MachineFingerprint

log = logging.getLogger(__name__)

LINEAR_PATHS = KERNEL_MODES[1:]  # ours, onednn, torch: also the order a forced path falls back in, ties break in
ROW_BUCKETS = (1, 8, 32, 64, 128, 512)  # rows a generator's linears run: decode batches up to prefill chunks
PREFILL_BUCKETS = (128, 512)  # a PRM's: prefill chunks (its MLP runs in chunks of <= 512 rows)
TIMED_CALLS, TIME_BUDGET_S = 7, 0.3  # per (shape, path, bucket): up to 7 timed calls, fewer past 0.3 s


@dataclass(frozen=True)
class LinearShape:
    out_features: int
    in_features: int
    dtype: str  # "bfloat16", "float32", ...
    bias: bool

    @property
    def key(self) -> str:
        return f"{self.dtype} {self.out_features}x{self.in_features}" + (" bias" if self.bias else "")


Timer = Callable[[str, LinearShape, int], float]  # (path, shape, rows) -> seconds of one call


def fastest_path(times: dict[str, dict[int, float]]) -> str:
    """path -> rows -> seconds: the path with the smallest geometric-mean time relative to each bucket's
    fastest (the fastest when there is one bucket); ties go to the earlier of LINEAR_PATHS."""
    buckets = next(iter(times.values())).keys()
    best = {rows: min(by_rows[rows] for by_rows in times.values()) for rows in buckets}
    slowdown = {path: statistics.fmean(math.log(by_rows[rows] / best[rows]) for rows in buckets)
                for path, by_rows in times.items()}
    return min(times, key=lambda path: (slowdown[path], LINEAR_PATHS.index(path)))


def bucket_winners(times: dict[str, dict[int, float]]) -> dict[int, str]:
    """rows -> the fastest path at that bucket."""
    buckets = next(iter(times.values())).keys()
    return {rows: min(times, key=lambda path: (times[path][rows], LINEAR_PATHS.index(path))) for rows in buckets}


def forced_path(mode: str, candidates: tuple[str, ...]) -> str:
    """The forced path where it can run, else the next of LINEAR_PATHS that can ("torch" always can)."""
    for path in LINEAR_PATHS[LINEAR_PATHS.index(mode):]:
        if path in candidates:
            return path
    return candidates[-1]


class KernelChoice:
    """Picks each linear's path (see the module docstring); one per loaded model.

    timer: (path, shape, rows) -> seconds (default: `time_linear`, a real measurement; tests inject one).
    cache_dir: where the per-machine file lives (default: beside the compiled C++ extension)."""

    def __init__(self, mode: str = "auto", fingerprint: MachineFingerprint | None = None,
                 cache_dir: Path | None = None, timer: Timer | None = None):
        if mode not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {mode!r}")
        self.mode = mode
        self.fingerprint = fingerprint or MachineFingerprint.current()
        self.cache_file = (cache_dir or cpu_kernels.build_directory()) / f"kernel-choice-{self.fingerprint.key}.json"
        self.timer = timer or time_linear
        self.times = self._load()  # "shape key|path|rows" -> seconds
        self.timings_taken = 0  # timer calls in this process: 0 when every shape came from the cache
        self.chosen: dict[str, str] = {}  # "shape key[ tied]" -> path
        self.winners: dict[str, dict[int, str]] = {}  # the same keys -> rows -> fastest path there
        self.uses: Counter = Counter()  # path -> linears that run it

    def linear_path(self, shape: LinearShape, candidates: tuple[str, ...], buckets: tuple[int, ...],
                    tied: bool = False) -> str:
        """The path one weight of this shape runs (candidates: the paths that can run it, LINEAR_PATHS order)."""
        key = shape.key + (" tied" if tied else "")
        if self.mode != "auto":
            path = forced_path(self.mode, candidates)
        elif len(candidates) == 1:
            path = candidates[0]
        else:
            times = {candidate: {rows: self._time(candidate, shape, rows) for rows in buckets} for candidate in candidates}
            path = fastest_path(times)
            self.winners[key] = bucket_winners(times)
        self.chosen[key] = path
        self.uses[path] += 1
        return path

    def _time(self, path: str, shape: LinearShape, rows: int) -> float:
        entry = f"{shape.key}|{path}|{rows}"
        if entry not in self.times:
            self.times[entry] = self.timer(path, shape, rows)
            self.timings_taken += 1
            self._save()
        return self.times[entry]

    def _load(self) -> dict[str, float]:
        if not self.cache_file.is_file():
            return {}
        stored = json.loads(self.cache_file.read_text())
        return stored["times"] if stored.get("fingerprint") == json.loads(json.dumps(asdict(self.fingerprint))) else {}

    def _save(self) -> None:
        """Atomically (another process may read or write the same file)."""
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"fingerprint": asdict(self.fingerprint), "times": self.times}, indent=1, sort_keys=True)
        with tempfile.NamedTemporaryFile("w", dir=self.cache_file.parent, delete=False, suffix=".tmp") as file:
            file.write(text)
        os.replace(file.name, self.cache_file)

    def report(self) -> dict:
        """What /health, the start-up log and the benchmark headers name: machine, mode, chosen paths."""
        return {"machine": self.fingerprint.describe(), "mode": self.mode, "linear_paths": dict(self.uses),
                "linears": dict(self.chosen), "bucket_winners": {k: dict(v) for k, v in self.winners.items()},
                "timings_taken": self.timings_taken, "cache": str(self.cache_file)}

    def describe(self) -> str:
        """One line: "kernels auto: linears ours x97, torch x1 (cache hit) on <machine>"."""
        uses = ", ".join(f"{path} x{count}" for path, count in sorted(self.uses.items(), key=lambda kv: -kv[1]))
        source = "cache hit" if self.timings_taken == 0 else f"{self.timings_taken} timings taken now"
        return f"kernels {self.mode}: linears {uses or 'none'} ({source}) on {self.fingerprint.describe()}"


# ---- the measurement ---------------------------------------------------------------------------------
_eviction: list[torch.Tensor] = []  # one buffer of twice the last-level cache, made on first use


def last_level_cache_bytes() -> int:
    path = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    text = path.read_text().strip() if path.is_file() else "32768K"
    scale = {"K": 2**10, "M": 2**20}.get(text[-1], 1)
    return int(text.rstrip("KM")) * scale


def evict_caches() -> None:
    """Read twice the last-level cache's bytes (read, not written: dirty lines would have to be written back
    during the timed call, taking memory bandwidth from it)."""
    if not _eviction:
        _eviction.append(torch.ones(2 * last_level_cache_bytes() // 4, dtype=torch.float32))
    _eviction[0].sum()


@torch.inference_mode()
def time_linear(path: str, shape: LinearShape, rows: int) -> float:
    """Seconds of one call of a random weight of `shape` on `path` with `rows` input rows, caches evicted
    before each call: one untimed call, then the fastest of up to TIMED_CALLS timed ones within TIME_BUDGET_S
    (the fastest, not the median: on a shared machine a parallel call whose thread is descheduled waits a
    whole time slice, ~10 ms, which would decide a small shape's choice)."""
    from specscale.model.transformer import Linear  # the layer is the thing measured; it imports this module

    dtype = getattr(torch, shape.dtype)
    with torch.device("meta"):
        linear = Linear(shape.in_features, shape.out_features, bias=shape.bias, dtype=dtype)
    linear = linear.to_empty(device="cpu")
    linear.weight.normal_(0.0, 0.02)
    if shape.bias:
        linear.bias.normal_(0.0, 0.02)
    linear.prepack(path)
    x = torch.randn(rows, shape.in_features).to(dtype)  # [rows, in]
    times: list[float] = []
    for call in range(TIMED_CALLS + 1):
        evict_caches()
        start = time.perf_counter()
        linear(x)
        times.append(time.perf_counter() - start)
        if call > 0 and sum(times[1:]) > TIME_BUDGET_S:
            break
    return min(times[1:])
