"""Row padding for the linears that run on oneDNN: a few distinct row counts, so a few cached primitives.

oneDNN (through ideep) JIT-compiles a primitive per distinct input shape of a matmul and keeps it in a cache
for the life of the process. The engine's batches have arbitrary row counts (decode batches of any size,
prefill chunks of any length, a PRM's step prefixes), so a long-running server meets new row counts for hours
and its resident memory creeps: on a Sapphire Rapids CPU a loop over random row counts 1..2048 through one
prepacked bf16 linear grew RSS from 230 to 1,070 MiB, ~0.4 MiB per new count (docs/bench/serve-soak.md).
Padding a linear's input rows with zeros up to the next of `STEPS_PER_OCTAVE` sizes per octave bounds the
distinct counts (at most ~90 up to 4,096 rows) and costs at most 1/8 more rows (none up to 15 rows, where
decode batches live); the same loop then stays flat at ~275 MiB.

Which linears: the "onednn" path (a prepacked weight), and F.linear on a bf16 weight where oneDNN runs bf16
matmuls (torch dispatches those to oneDNN too). Not our bf16 kernel ("ours", model/cpu_kernels.py, no
per-shape state) and not fp32 F.linear (MKL's sgemm, no per-shape state). A padded row is zeros and each
output row depends on its own input row only, so the rows kept equal the unpadded result up to the
rounding a different kernel blocking may bring (oneDNN may block a 256-row matmul differently from a 250-row
one; the unpadded result already depended on the batch's row count in the same way).

Padding bounds the primitives, it does not make them appear at once: a server meets a rare bucket size (a
large prefill chunk) for the first time hours in, and the ~0.6 MiB its primitive takes shows as a slow creep
(~400 MiB/h at the start of a soak on the toy models). `warm` runs each distinct padded linear of a model
once at every bucket size its engine can run, at load (`specscale serve` and each Ray replica:
server/serving_process.py, scaleout/verifier_replica.py): the toy models' 6 shapes x 72 sizes take ~3 s and
~270 MiB, which the server then holds from its start instead of growing into.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

STEPS_PER_OCTAVE = 8  # sizes per power of two: 16, 18, 20, ..., 30, 32, 36, ...: at most 12.5% padding


def padded_rows(rows: int) -> int:
    """The bucket size for `rows`: rows itself up to 2 * STEPS_PER_OCTAVE - 1, else rounded up to a
    multiple of 2^(floor(log2(rows)) - log2(STEPS_PER_OCTAVE)). Every bucket size maps to itself."""
    shift = rows.bit_length() - STEPS_PER_OCTAVE.bit_length()
    if shift <= 0:
        return rows
    step = 1 << shift
    return -(-rows // step) * step


def pads_rows(path: str, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a Linear on `path` ("ours", "onednn", "transposed", "torch") with this weight dtype runs on oneDNN
    here."""
    if device.type != "cpu":
        return False
    if path == "onednn":
        return True
    return path in ("transposed", "torch") and dtype == torch.bfloat16 and onednn_runs_bf16()


def onednn_runs_bf16() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """x [T, in] -> [padded_rows(T), in], the added rows zero (x itself when T is a bucket size, or x is not
    a matrix)."""
    if x.dim() != 2:
        return x
    rows = x.shape[0]
    target = padded_rows(rows)
    return x if target == rows else F.pad(x, (0, 0, 0, target - rows))


def bucket_sizes(max_rows: int) -> list[int]:
    """Every bucket size a linear of at most `max_rows` rows runs at."""
    return sorted({padded_rows(rows) for rows in range(1, max_rows + 1)})


def warm(model: nn.Module, max_rows: int) -> int:
    """Run each distinct padded linear of `model` (by shape, bias, path: oneDNN keys its primitives by shape,
    not by weight) at every bucket size up to `max_rows` on zeros; the number of runs."""
    distinct: dict[tuple, nn.Linear] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear) and getattr(module, "pad_rows", False):
            key = (module.in_features, module.out_features, module.bias is not None, getattr(module, "path", ""))
            distinct.setdefault(key, module)
    dtype: torch.dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype
    sizes = bucket_sizes(max_rows)
    with torch.inference_mode():
        for module in distinct.values():
            for size in sizes:
                module(torch.zeros(size, module.in_features, dtype=dtype))
    return len(distinct) * len(sizes)


def warm_engines(engines: Iterable) -> int:
    """`warm` the model of every engine that runs a checkpoint (a simulated runner has none), up to the most
    tokens one engine step runs (EngineConfig.max_num_batched_tokens)."""
    runs = 0
    for engine in engines:
        model = getattr(engine.runner, "model", None)
        if model is not None:
            runs += warm(model, engine.config.max_num_batched_tokens)
    return runs
