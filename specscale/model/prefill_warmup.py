"""Run torch's prefill SDPA once at every padded shape a server meets (model/prefill_padding.py), before the
first request: aten keeps the oneDNN micro-kernel it builds for each block shape in a per-thread cache, so the
warm must run on the thread that runs the engines (the server's engine thread: server/engine_loop.py, given
`warm_engines` by server/serving_process.py), with one batch row per torch thread so that each worker thread of the
flash kernel's static split meets every block shape."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specscale.model.attention import prefill_sdpa
from specscale.model.prefill_padding import pads_sdpa, warm_shapes


def warm(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, max_query: int, max_keys: int) -> int:
    """Run the torch prefill SDPA at every `warm_shapes` pair, masked and causal, on this thread; the calls."""
    rows = max(torch.get_num_threads(), 1)  # one batch row per thread: each thread meets every block shape
    scale = head_dim**-0.5
    calls = 0
    with torch.inference_mode():
        for grid, keys in warm_shapes(max_query, max_keys):
            q = torch.zeros(rows, grid, heads, head_dim, dtype=dtype)
            k = torch.zeros(rows, kv_heads, keys, head_dim, dtype=dtype)
            mask = torch.ones(rows, 1, grid, keys, dtype=torch.bool)
            prefill_sdpa(q, k, k, mask, scale)
            prefill_sdpa(q, k, k, None, scale)
            calls += 2
    return calls


def warm_engines(engines: Iterable) -> int:
    """`warm` every engine whose model runs the torch prefill path on CPU (for long or short prefills), up to its
    longest prefill chunk (EngineConfig.max_num_batched_tokens) and context (max_model_len); the SDPA calls.
    Call it on the thread that will run the engines."""
    done: set[tuple] = set()
    calls = 0
    for engine in engines:
        runner = engine.runner
        model = getattr(runner, "model", None)
        on_kernel = getattr(runner, "use_prefill_kernel", True) and getattr(runner, "use_short_prefill_kernel", True)
        if model is None or on_kernel or not pads_sdpa(runner.device):
            continue
        args = model.args
        max_query = min(engine.config.max_num_batched_tokens, engine.max_model_len)
        key = (args.num_heads, args.num_kv_heads, args.head_dim, runner.dtype, max_query, engine.max_model_len)
        if key not in done:
            done.add(key)
            calls += warm(*key)
    return calls
