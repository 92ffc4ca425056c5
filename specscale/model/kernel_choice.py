"""KernelChoice: which path every linear runs on this machine, chosen by measurement, cached per machine.

The fastest GEMM depends on the CPU: on an AMD EPYC with AVX512-BF16 and no AMX our bf16 kernel streams the
weights of a decode step faster than oneDNN, on an Intel Xeon with AMX oneDNN's AMX kernels are several times
faster than ours (docs/bench/real-size.md). So no fixed rule: the paths of a linear
(model/linear.py `Linear`, LINEAR_PATHS) are timed on this machine for each weight shape at each row
bucket the engine runs (ROW_BUCKETS for a generator: decode batches and prefill chunks; PREFILL_BUCKETS for
a PRM, which only prefills), each call on a weight evicted from the caches (a decode step streams every
weight from memory) by a path warmed up on a twin weight (model/kernel_timing.py). The timings are cached in
a JSON file named by the machine's fingerprint (model/machine.py: CPU model, ISA flags, threads, torch
version) beside the compiled C++ extension, so a later start on the same machine measures nothing; a cache
written by another TIMING_METHOD is measured afresh, and so is every shape under
SPECSCALE_REMEASURE_KERNELS=1 or `specscale kernels --remeasure` (timings taken on a busy machine go stale).

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
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from specscale.config import KERNEL_MODES
from specscale.model import cpu_kernels
from specscale.model.machine import MachineFingerprint

log = logging.getLogger(__name__)

LINEAR_PATHS = KERNEL_MODES[1:]  # ours, onednn, torch: also the order a forced path falls back in, ties break in
ROW_BUCKETS = (1, 8, 32, 64, 128, 512)  # rows a generator's linears run: decode batches up to prefill chunks
# a PRM's: the tokens of one verifier call, from a sibling group's new tokens (with few requests in flight, or
# under lazy verification's sibling-group trigger, docs/design.md "Verification", a search calls the PRM with
# 60-220 tokens on the bundled models) to the lazy-verification threshold (2,048); its MLP runs in chunks of
# <= 512 rows (transformer.py MLP_CHUNK_ROWS).
# (A path's lead can flip across that range: on an AMD EPYC oneDNN leads at 2,048 rows, ours at 64.)
PREFILL_BUCKETS = (64, 256, 512, 2048)
MIN_ROUNDS, MAX_ROUNDS, BUCKET_BUDGET_S = 2, 15, 0.3  # timed rounds over the paths per (shape, bucket)
# how the timings were taken: 3 = as 2, and torch's prefill attention runs SDPA's flash kernel (2 = weight cold,
# path warm; 1, unversioned: caches evicted, path cold too)
TIMING_METHOD = 3
REMEASURE_ENV = "SPECSCALE_REMEASURE_KERNELS"


@dataclass(frozen=True)
class LinearShape:
    out_features: int
    in_features: int
    dtype: str  # "bfloat16", "float32", ...
    bias: bool

    @property
    def key(self) -> str:
        return f"{self.dtype} {self.out_features}x{self.in_features}" + (" bias" if self.bias else "")


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def key(self) -> str:
        return f"{self.dtype} {self.heads}/{self.kv_heads}x{self.head_dim}"


ATTENTION_PATHS = ("cpp", "torch")  # the C++ kernels (model/cpu_kernels.py) or gather + SDPA
# torch replaces the C++ kernels only when it measures this many times faster: for decode by a margin (one
# stalled timing must not switch off every fused op that goes with the decode kernel), for prefill (the kernel
# alone) when it is faster at all
ATTENTION_MARGIN = {"decode": 2.0, "prefill": 1.0, "short-prefill": 1.0}
# the batches attention is timed on: 32 decode rows on 256-token contexts; 8 x 128 new tokens on 256 cached
DECODE_ROWS, PREFILL_ROWS, NEW_TOKENS, CONTEXT_TOKENS, BLOCK_TOKENS = 32, 8, 128, 256, 16
# A short prefill is a batch whose longest row brings at most SHORT_PREFILL_MAX_TOKENS new tokens: a search's
# PRM calls (a step or two per path on a cached question and earlier steps). Its path is timed apart, on
# 8 x SHORT_NEW_TOKENS new tokens on SHORT_CONTEXT_TOKENS cached: on the Xeon with AMX SDPA wins the long
# prefills (15-20 against 46 ms at 4 x 1024) and the C++ kernel the short ones (the search's PRM time -23%,
# docs/bench/cpu-ladder.md).
SHORT_PREFILL_MAX_TOKENS, SHORT_NEW_TOKENS, SHORT_CONTEXT_TOKENS = 64, 32, 384
AttentionTimer = Callable[[AttentionShape, str], dict[str, float]]

# (shape, paths, buckets) -> path -> rows -> seconds of one call
Timer = Callable[[LinearShape, tuple[str, ...], tuple[int, ...]], dict[str, dict[int, float]]]


def fastest_path(times: dict[str, dict[int, float]]) -> str:
    """path -> rows -> seconds: the path with the smallest geometric-mean time relative to each bucket's
    fastest (the fastest when there is one bucket); ties go to the earlier of LINEAR_PATHS."""
    buckets = next(iter(times.values())).keys()
    best = {rows: min(by_rows[rows] for by_rows in times.values()) for rows in buckets}
    slowdown = {path: statistics.fmean(math.log(by_rows[rows] / best[rows]) for rows in buckets)
                for path, by_rows in times.items()}
    return min(times, key=lambda path: (slowdown[path], LINEAR_PATHS.index(path)))


def attention_winner(kind: str, times: dict[str, float]) -> str:
    """"torch" when it measures ATTENTION_MARGIN[kind] times faster than the C++ kernel, else "cpp"."""
    faster = times.get("torch", math.inf) * ATTENTION_MARGIN[kind] < times.get("cpp", math.inf)
    return "torch" if faster else "cpp"


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

    timer: (shape, paths, buckets) -> path -> rows -> seconds; attention_timer: (shape, "decode" | "prefill")
    -> {"cpp": s, "torch": s}. The real ones are model/kernel_timing.py's (`measured_choice`); tests inject
    theirs; without one only the cache can answer.
    cache_dir: where the per-machine file lives (default: beside the compiled C++ extension)."""

    def __init__(self, mode: str = "auto", fingerprint: MachineFingerprint | None = None,
                 cache_dir: Path | None = None, timer: Timer | None = None,
                 attention_timer: AttentionTimer | None = None):
        if mode not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {KERNEL_MODES}, got {mode!r}")
        self.mode = mode
        self.fingerprint = fingerprint or MachineFingerprint.current()
        self.cache_file = (cache_dir or cpu_kernels.build_directory()) / f"kernel-choice-{self.fingerprint.key}.json"
        self.timer = timer or unmeasured
        self.attention_timer = attention_timer or unmeasured
        # "shape key|path|rows" -> seconds; none under SPECSCALE_REMEASURE_KERNELS=1 (measured afresh, saved)
        self.times = {} if os.environ.get(REMEASURE_ENV, "") not in ("", "0") else self._load()
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
            times = self._times(shape, candidates, buckets)
            path = fastest_path(times)
            self.winners[key] = bucket_winners(times)
        self.chosen[key] = path
        self.uses[path] += 1
        return path

    def attention_path(self, shape: AttentionShape, kind: str) -> str:
        """"cpp" or "torch" for decode, prefill or short-prefill attention (kind): the C++ kernel unless torch measures
        ATTENTION_MARGIN[kind] times faster here (cached like the linears; the kernels must have built, and for
        prefill support the head size). The decode choice carries the fused norm / RoPE / activation ops."""
        entry = lambda path: f"{kind} attention {shape.key}|{path}"  # noqa: E731
        if not all(entry(path) in self.times for path in ATTENTION_PATHS):
            measured = self.attention_timer(shape, kind)
            self.times.update({entry(path): measured[path] for path in ATTENTION_PATHS})
            self.timings_taken += len(ATTENTION_PATHS)
            self.save()
        path = attention_winner(kind, {path: self.times[entry(path)] for path in ATTENTION_PATHS})
        self.chosen[f"{kind} attention {shape.key}"] = path
        return path

    def _times(self, shape: LinearShape, paths: tuple[str, ...], buckets: tuple[int, ...]) -> dict[str, dict[int, float]]:
        """path -> rows -> seconds, from the cache, or measured (all of the shape's cells at once) and cached."""
        entry = lambda path, rows: f"{shape.key}|{path}|{rows}"  # noqa: E731
        if not all(entry(path, rows) in self.times for path in paths for rows in buckets):
            measured = self.timer(shape, paths, buckets)
            self.times.update({entry(path, rows): measured[path][rows] for path in paths for rows in buckets})
            self.timings_taken += len(paths) * len(buckets)
            self.save()
        return {path: {rows: self.times[entry(path, rows)] for rows in buckets} for path in paths}

    def _load(self) -> dict[str, float]:
        if not self.cache_file.is_file():
            return {}
        stored = json.loads(self.cache_file.read_text())
        same = stored.get("fingerprint") == json.loads(json.dumps(asdict(self.fingerprint)))
        return stored["times"] if same and stored.get("timing_method") == TIMING_METHOD else {}

    def save(self) -> None:
        """Atomically (another process may read or write the same file)."""
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"fingerprint": asdict(self.fingerprint), "timing_method": TIMING_METHOD,
                           "times": self.times}, indent=1, sort_keys=True)
        with tempfile.NamedTemporaryFile("w", dir=self.cache_file.parent, delete=False, suffix=".tmp") as file:
            file.write(text)
        os.replace(file.name, self.cache_file)

    def cached_linears(self) -> dict[str, dict[str, dict[int, float]]]:
        """shape key -> path -> rows -> seconds: every linear timing this machine's cache holds."""
        table: dict[str, dict[str, dict[int, float]]] = {}
        for entry, seconds in self.times.items():
            key, path, *rows = entry.split("|")  # an attention entry has no rows: "prefill attention ...|cpp"
            if " attention " not in f" {key}":
                table.setdefault(key, {}).setdefault(path, {})[int(rows[0])] = seconds
        return table

    def cached_attention(self) -> dict[str, dict[str, float]]:
        """"decode attention <shape key>" / "prefill attention ..." -> path -> seconds, from the cache."""
        table: dict[str, dict[str, float]] = {}
        for entry, seconds in self.times.items():
            key, path = entry.split("|")[:2]
            if " attention " in f" {key}":
                table.setdefault(key, {})[path] = seconds
        return table

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


def describe_paths(report: dict) -> str:
    """An engine's kernels() report in one line: "kernels auto: linears ours x97, attention cpp, prefill
    attention cpp" (the start-up log, the benchmark headers)."""
    linears = ", ".join(f"{path} x{count}" for path, count in report.get("linear_paths", {}).items())
    return (f"kernels {report.get('mode', '-')}: linears {linears or 'plain'}, attention {report['attention']}, "
            f"prefill attention {report['prefill_attention']}")


def parse_linear_key(key: str) -> LinearShape:
    """LinearShape.key back to the shape: "bfloat16 4864x896 bias" -> LinearShape(4864, 896, "bfloat16", True)."""
    dtype, size, *rest = key.split()
    out_features, in_features = (int(n) for n in size.split("x"))
    return LinearShape(out_features, in_features, dtype, rest == ["bias"])


def parse_attention_key(key: str) -> tuple[str, AttentionShape]:
    """"decode attention bfloat16 14/2x64" -> ("decode", AttentionShape(14, 2, 64, "bfloat16"))."""
    kind, _, dtype, size = key.split()
    heads, rest = size.split("/")
    kv_heads, head_dim = rest.split("x")
    return kind, AttentionShape(int(heads), int(kv_heads), int(head_dim), dtype)


def format_cached(choice: KernelChoice) -> str:
    """What `specscale kernels` prints: the machine, the cache file, and per cached linear shape the path a
    weight of it takes, each bucket's fastest path and every path's time (ms) and GFLOP/s there; then attention."""
    lines = [f"machine: {choice.fingerprint.describe()}", f"fingerprint: {choice.fingerprint.key}",
             f"cache: {choice.cache_file} ({'present' if choice.cache_file.is_file() else 'absent'}, "
             f"timing method {TIMING_METHOD}, {len(choice.times)} timings)"]
    linears = choice.cached_linears()
    if not linears:
        lines.append("no linear timings cached for this machine: load a model (or `specscale kernels --model DIR`)")
    for key, times in sorted(linears.items()):
        shape = parse_linear_key(key)
        untied = {path: t for path, t in times.items() if path != "onednn"}
        tied = f"; a tied head: {fastest_path(untied)}" if "onednn" in times and len(untied) > 1 else ""
        lines.append(f"{key}: {fastest_path(times)}{tied}")
        for rows, winner in sorted(bucket_winners(times).items()):
            flops = 2 * rows * shape.out_features * shape.in_features
            cells = "  ".join(f"{path} {times[path][rows] * 1e3:.3f} ms {flops / times[path][rows] / 1e9:.0f} GF/s"
                              for path in LINEAR_PATHS if path in times)
            lines.append(f"  {rows:>5} rows -> {winner:<6}  {cells}")
    for key, attention_times in sorted(choice.cached_attention().items()):
        cells = "  ".join(f"{path} {seconds * 1e3:.3f} ms" for path, seconds in sorted(attention_times.items()))
        lines.append(f"{key}: {attention_winner(key.split()[0], attention_times)}  ({cells})")
    return "\n".join(lines)


def unmeasured(*args):
    raise ValueError("this KernelChoice has no timer and the cache lacks the timing (model/kernel_timing.py)")
