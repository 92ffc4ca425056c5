"""Prefill attention on torch's SDPA (CPU): a few query-grid and key lengths, so a few cached micro-kernels.

The torch prefill path (`model/attention.py` `prefill_attention`) hands SDPA a [Bp, Lq] query grid and the
gathered context of S keys. On CPU SDPA runs its flash kernel, which cuts queries and keys into blocks (in
torch 2.13: 32, 64 or 256 query rows by the query length, 512 keys) and, for bf16 / fp16 on a CPU with AMX,
multiplies each block with a oneDNN brgemm micro-kernel built for that block's rows, columns and strides. aten
keeps every micro-kernel it built in a per-thread cache that is never evicted (cpublas' `KernelCache`), so each
new (Lq, S) pair can leave a few hundred KB behind for the life of the process: a server meets new lengths for
hours and its resident memory creeps. 3,000 SDPA calls of random lengths (the toy models' heads, one thread)
grew a process by 400 MiB without levelling off; the soak's server grew ~+10%/h (docs/bench/serve-soak.md).

Padding the grid to `grid_len` rows (a power of two up to 32, then multiples of 32) and the keys to `key_len`
(a power of two up to 32, then multiples of 64) leaves few distinct block shapes — the same loop then stops
growing after ~54 MiB — and costs at most 31 padded query rows and 63 padded keys (masked out; a padded
query row is dropped). The torch decode path (`decode_attention` without the C++ kernel) pads its keys the
same way. CUDA has no such cache: padding applies on CPU only (`pads_sdpa`).

`model/prefill_warmup.py` runs SDPA once at every padded shape a server meets, before the first request.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QUERY_STEP = 32  # grid lengths above 32 rows: multiples of 32 (the flash kernel's smallest query split)
KEY_STEP = 64  # key lengths above 32: multiples of 64
WARM_QUERY_MAX = 1024  # longer grids repeat the block shapes of 768..1024 (256-row query blocks)
WARM_KEYS_BEYOND = 512  # keys past the grid's own length (or past 512): one more 512-key block covers every key tail


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def grid_len(rows: int) -> int:
    """The query grid's length for a prefill whose longest sequence brings `rows` new tokens."""
    return _pow2_at_least(rows) if rows <= QUERY_STEP else -(-rows // QUERY_STEP) * QUERY_STEP


def key_len(keys: int) -> int:
    """The gathered context's length for `keys` keys (a block table's width x the block size)."""
    return _pow2_at_least(keys) if keys <= 32 else -(-keys // KEY_STEP) * KEY_STEP


def pads_sdpa(device: torch.device) -> bool:
    """Whether the torch attention paths pad their grid and keys here (CPU: SDPA's per-thread kernel cache)."""
    return device.type == "cpu"


def warm_shapes(max_query: int, max_keys: int) -> list[tuple[int, int]]:
    """(grid length, key length) pairs `warm` runs: every grid length up to min(max_query, WARM_QUERY_MAX),
    each with every key length from its own to WARM_KEYS_BEYOND past it or past 512, whichever is longer (at most
    `key_len(max_keys)`): longer contexts repeat the 512-key blocks and their tails seen here."""
    top_keys = key_len(max_keys)
    grids = sorted({grid_len(rows) for rows in range(1, min(max_query, WARM_QUERY_MAX, top_keys) + 1)})
    pairs = []
    for grid in grids:
        first = key_len(grid)
        last = min(max(first, WARM_KEYS_BEYOND) + WARM_KEYS_BEYOND, top_keys)
        keys = sorted({key_len(n) for n in range(first, last + 1)})
        pairs += [(grid, k) for k in keys]
    return pairs


def pad_block_tables(tables: torch.Tensor, block_size: int) -> torch.Tensor:
    """Block tables [B, nb] -> [B, nb'] whose nb' x block_size keys is a `key_len`. The extra columns name block 0:
    finite keys that the caller masks out (context lengths, or the causal mask)."""
    width = -(-key_len(tables.shape[1] * block_size) // block_size)  # ceil(key_len / block_size)
    return tables if width <= tables.shape[1] else F.pad(tables, (0, width - tables.shape[1]))
