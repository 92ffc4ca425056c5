"""Row padding for the linears that run on oneDNN: a few distinct row counts, so a few cached primitives.

oneDNN (through ideep) JIT-compiles a primitive per distinct input shape of a matmul and keeps it in a cache
for the life of the process. The engine's batches have arbitrary row counts (decode batches of any size,
prefill chunks of any length, a PRM's step prefixes), so a long-running server meets new row counts for hours
and its resident memory creeps: on a Sapphire Rapids CPU a loop over random row counts 1..2048 through one
prepacked bf16 linear grew RSS from 230 to 1,070 MiB, ~0.4 MiB per new count (docs/BENCHMARKS.md, "Soak").
Padding a linear's input rows with zeros up to the next of `STEPS_PER_OCTAVE` sizes per octave bounds the
distinct counts (at most ~90 up to 4,096 rows) and costs at most 1/8 more rows (none up to 15 rows, where
decode batches live); the same loop then stays flat at ~275 MiB.

Which linears: the "onednn" path (a prepacked weight), and F.linear on a bf16 weight where oneDNN runs bf16
matmuls (torch dispatches those to oneDNN too). Not our bf16 kernel ("ours", model/cpu_kernels.py, no
per-shape state) and not fp32 F.linear (MKL's sgemm, no per-shape state). A padded row is zeros and each
output row depends on its own input row only, so the rows kept equal the unpadded result up to the
rounding a different kernel blocking may bring (oneDNN may block a 256-row matmul differently from a 250-row
one; the unpadded result already depended on the batch's row count in the same way).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
    """Whether a Linear on `path` ("ours", "onednn", "torch") with this weight dtype runs on oneDNN here."""
    if device.type != "cpu":
        return False
    if path == "onednn":
        return True
    return path == "torch" and dtype == torch.bfloat16 and onednn_runs_bf16()


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
