"""The real timers of model/kernel_choice.py: a linear's paths and attention's two, timed on this machine.

Apart from kernel_choice.py because they build the layers they time (model/transformer.py imports the choice).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from specscale.model.attention import AttentionMetadata, decode_attention, padded_prefill_metadata, prefill_attention
from specscale.model.kernel_choice import (
    BLOCK_TOKENS,
    BUCKET_BUDGET_S,
    CONTEXT_TOKENS,
    DECODE_ROWS,
    LINEAR_PATHS,
    MAX_ROUNDS,
    MIN_ROUNDS,
    NEW_TOKENS,
    PREFILL_ROWS,
    SHORT_CONTEXT_TOKENS,
    SHORT_NEW_TOKENS,
    AttentionShape,
    KernelChoice,
    LinearShape,
    parse_attention_key,
    parse_linear_key,
)
from specscale.model.linear import Linear


def measured_choice(mode: str) -> KernelChoice:
    """The engine's KernelChoice: this machine's cache, measured with the real timers where it lacks a shape."""
    return KernelChoice(mode, timer=time_paths, attention_timer=time_attention)


def remeasure(choice: KernelChoice) -> int:
    """Time again every linear shape and attention shape `choice`'s cache holds, at its cached paths and
    buckets, and save the new times (`specscale kernels --remeasure`); returns the cells timed."""
    taken = 0
    for key, times in choice.cached_linears().items():
        paths = tuple(path for path in LINEAR_PATHS if path in times)
        buckets = tuple(sorted(next(iter(times.values()))))
        measured = time_paths(parse_linear_key(key), paths, buckets)
        choice.times.update({f"{key}|{path}|{rows}": measured[path][rows] for path in paths for rows in buckets})
        taken += len(paths) * len(buckets)
    for key in choice.cached_attention():
        kind, shape = parse_attention_key(key)
        choice.times.update({f"{key}|{path}": seconds for path, seconds in time_attention(shape, kind).items()})
        taken += 2
    choice.timings_taken += taken
    choice.save()
    return taken


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
def time_paths(shape: LinearShape, paths: tuple[str, ...], buckets: tuple[int, ...]) -> dict[str, dict[int, float]]:
    """path -> rows -> seconds of one call of a random weight of `shape`: the weight cold, the path warm.

    Before each timed call the caches are evicted and the same path then runs once, untimed, on a twin weight
    of the same shape (`warm_call`): what a path keeps between calls (oneDNN's primitive and its JIT code,
    its scratchpad, our kernel's code) is warm, as in a model's forward, where the same path has just run
    the previous layer, while the timed weight comes from memory, as in a decode step. Evicting alone made
    every oneDNN call pay for a cold primitive (~0.3 ms on the Xeon with AMX of docs/bench/machines.md, where it
    is 3-8x faster than ours once warm), and `auto` kept the slower path.

    Bucket by bucket, the paths' calls are interleaved: each round times every path once (after one untimed
    round), for at least MIN_ROUNDS and at most MAX_ROUNDS rounds or until BUCKET_BUDGET_S is spent, and a
    path's time is its fastest round. On a shared machine a parallel call whose thread is descheduled waits
    a whole time slice (~10 ms): the fastest of many interleaved rounds is the one such stalls missed."""
    layers = {path: (linear_on_path(shape, path), linear_on_path(shape, path)) for path in paths}  # timed, twin
    times: dict[str, dict[int, float]] = {path: {} for path in paths}
    for rows in buckets:
        x = torch.randn(rows, shape.in_features).to(getattr(torch, shape.dtype))  # [rows, in]
        calls: dict[str, list[float]] = {path: [] for path in paths}
        start = time.perf_counter()
        for round_ in range(MAX_ROUNDS + 1):
            for path in paths:
                calls[path].append(warm_call(*layers[path], x))
            if round_ >= MIN_ROUNDS and time.perf_counter() - start > BUCKET_BUDGET_S:
                break
        for path in paths:
            times[path][rows] = min(calls[path][1:])
    return times


def warm_call(layer, twin, x: torch.Tensor) -> float:
    """Seconds of layer(x) with layer's weight out of the caches and its path warmed up by twin(x)."""
    evict_caches()
    twin(x)
    start = time.perf_counter()
    layer(x)
    return time.perf_counter() - start


def linear_on_path(shape: LinearShape, path: str):
    """A Linear of `shape` with random weights, laid out for `path`."""
    with torch.device("meta"):
        linear = Linear(shape.in_features, shape.out_features, bias=shape.bias, dtype=getattr(torch, shape.dtype))
    linear = linear.to_empty(device="cpu")
    with torch.no_grad():
        linear.weight.normal_(0.0, 0.02)
        if shape.bias:
            linear.bias.normal_(0.0, 0.02)
    linear.prepack(path)
    return linear


@torch.inference_mode()
def time_attention(shape: AttentionShape, kind: str) -> dict[str, float]:
    """Seconds of one decode (DECODE_ROWS rows on CONTEXT_TOKENS-token contexts), prefill (PREFILL_ROWS x
    NEW_TOKENS on CONTEXT_TOKENS) or short-prefill (PREFILL_ROWS x SHORT_NEW_TOKENS on SHORT_CONTEXT_TOKENS)
    attention call, per path: the fastest of interleaved rounds, as time_paths."""
    if kind == "decode":
        calls = decode_calls(shape)
    elif kind == "short-prefill":
        calls = prefill_calls(shape, SHORT_NEW_TOKENS, SHORT_CONTEXT_TOKENS)
    else:
        calls = prefill_calls(shape, NEW_TOKENS, CONTEXT_TOKENS)
    times: dict[str, list[float]] = {path: [] for path in calls}
    start = time.perf_counter()
    for round_ in range(MAX_ROUNDS + 1):
        for path, call in calls.items():
            evict_caches()
            began = time.perf_counter()
            call()
            times[path].append(time.perf_counter() - began)
        if round_ >= MIN_ROUNDS and time.perf_counter() - start > BUCKET_BUDGET_S:
            break
    return {path: min(taken[1:]) for path, taken in times.items()}


def random_caches(shape: AttentionShape, rows: int, tokens: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """K and V caches of `rows` sequences of `tokens` tokens each, and their block tables [rows, blocks] int32."""
    blocks = tokens // BLOCK_TOKENS
    dtype = getattr(torch, shape.dtype)
    caches = [torch.randn(rows * blocks, BLOCK_TOKENS, shape.kv_heads, shape.head_dim).to(dtype) for _ in range(2)]
    return caches, torch.arange(rows * blocks, dtype=torch.int32).view(rows, blocks)


def decode_calls(shape: AttentionShape) -> dict[str, Callable[[], torch.Tensor]]:
    (key_cache, value_cache), tables = random_caches(shape, DECODE_ROWS, CONTEXT_TOKENS)
    q = torch.randn(DECODE_ROWS, shape.heads, shape.head_dim).to(getattr(torch, shape.dtype))  # [B, H, D]
    lens = torch.full((DECODE_ROWS,), CONTEXT_TOKENS, dtype=torch.int32)
    scale = shape.head_dim**-0.5
    return {"cpp": lambda: decode_attention(q, key_cache, value_cache, tables, lens, scale, True),
            "torch": lambda: decode_attention(q, key_cache, value_cache, tables.long(), lens.long(), scale, False)}


def prefill_calls(shape: AttentionShape, new_tokens: int, context: int) -> dict[str, Callable[[], torch.Tensor]]:
    """PREFILL_ROWS sequences, each adding new_tokens to `context` cached ones."""
    (key_cache, value_cache), tables = random_caches(shape, PREFILL_ROWS, context + new_tokens)
    q = torch.randn(PREFILL_ROWS * new_tokens, shape.heads, shape.head_dim).to(getattr(torch, shape.dtype))
    starts, counts = torch.full((PREFILL_ROWS,), context), torch.full((PREFILL_ROWS,), new_tokens)
    common = {"slot_mapping": starts, "num_decode_tokens": 0, "decode_block_tables": None, "decode_context_lens": None}
    kernel = AttentionMetadata(**common, prefill_block_tables=tables, prefill_mask=None, prefill_query_index=None,
                               prefill_query_len=0, prefill_starts=starts, prefill_counts=counts,
                               use_cpu_kernels=True, use_prefill_kernel=True)
    padded = AttentionMetadata(**common, **padded_prefill_metadata(tables.long(), starts, counts, BLOCK_TOKENS))
    scale = shape.head_dim**-0.5
    return {"cpp": lambda: prefill_attention(q, key_cache, value_cache, kernel, scale),
            "torch": lambda: prefill_attention(q, key_cache, value_cache, padded, scale)}
