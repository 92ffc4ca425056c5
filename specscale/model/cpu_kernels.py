"""C++ CPU kernels (model/csrc/cpu_kernels.cpp), compiled on first use with torch's JIT extension loader.

- paged decode attention: reads each sequence's K/V blocks in place; the plain-torch path first gathers
  them into a dense tensor (a read, a write and a read again), which dominates decode at large batches;
- paged causal prefill attention (AVX-512 builds): the new tokens of each sequence against its cached
  context, without the padded query grid and [Bp, Lq, S] mask the torch path builds (1.8x faster than
  that SDPA on the PRM's 8 x 128-token batches on 512-token contexts);
- fused residual add + RMSNorm, RoPE on q and k + KV-cache write, silu(gate) * up: each replaces a chain
  of small torch ops whose fixed per-call cost dominates a decode iteration of a small model;
- the exponential-race sampler in one pass (engine/sampler.py);
- a bf16 linear (AVX512-BF16 builds) on a weight packed for it once at load time (model/transformer.py
  `Linear`): fp32 accumulation, a row's result independent of its batch, and the next weights prefetched
  while the current ones are multiplied (docs/bench/real-size.md).

All but the linear are used together or not at all (TorchModelRunner / EngineConfig.attention_backend); the
linear is one of the paths a weight may take, chosen by measurement when the model loads
(model/kernel_choice.py). When no compiler is available the engine falls back to the plain-torch path (and
oneDNN or F.linear for the linears) behind the same calls. Under `SPECSCALE_CPU_ISA=avx2`
(model/machine.py) the kernels compile for x86-64-v3 (AVX2 + FMA) as a separate extension: the portable
code an AVX2-only CPU runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from pathlib import Path

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from specscale.model.machine import forced_isa

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "cpu_kernels.cpp"

_lock = threading.Lock()
_module = None
_failed = False


def extension_name() -> str:
    return "specscale_cpu_kernels" + (f"_{forced_isa()}" if forced_isa() else "")


def build_directory() -> Path:
    """Where torch's JIT loader builds (and caches) this process's extension: one folder per source checkout,
    since the loader rebuilds whenever another checkout's build used the folder (a ~1-10 minute compile)."""
    from torch.utils.cpp_extension import get_default_build_root

    checkout = hashlib.sha256(str(SOURCE.resolve()).encode()).hexdigest()[:8]
    return Path(get_default_build_root()) / f"{extension_name()}-{checkout}"


def _build():
    from torch.utils.cpp_extension import load

    # -ffp-contract=off: no fused multiply-adds the plain-torch path does not do (fp32 results match it)
    march = "-march=x86-64-v3" if forced_isa() == "avx2" else "-march=native"
    flags = ["-O3", "-fopenmp", march, "-std=c++17", "-ffp-contract=off"]
    build_directory().mkdir(parents=True, exist_ok=True)
    if not any(build_directory().glob("*.so")):  # a first start on this machine: say why it is slow
        print(f"specscale: compiling the C++ CPU kernels for this machine (once; cached in {build_directory()})",
              file=sys.stderr, flush=True)
    return load(name=extension_name(), sources=[str(SOURCE)], extra_cflags=flags, extra_ldflags=["-fopenmp"],
                build_directory=str(build_directory()), verbose=False)


def available() -> bool:
    """True once the kernels are compiled and loaded; compiles them on the first call (tens of seconds)."""
    global _module, _failed
    if _module is not None or _failed:
        return _module is not None
    if os.environ.get("SPECSCALE_DISABLE_CPU_KERNELS"):
        _failed = True
        return False
    with _lock:
        if _module is None and not _failed:
            try:
                _module = _build()
            except Exception as exc:  # a missing compiler must not stop the engine: fall back to torch
                log.warning("C++ CPU kernels unavailable, using the plain torch path: %s", exc)
                _failed = True
    return _module is not None


def paged_decode_attention(q, key_cache, value_cache, block_tables, context_lens, scale: float):
    """q [B, H, D] -> [B, H, D]; reads K/V straight from the paged caches."""
    return _module.paged_decode(q, key_cache, value_cache, block_tables, context_lens, float(scale))


def has_prefill_kernel(head_dim: int) -> bool:
    """Whether paged_prefill_attention runs for this head size (AVX-512 builds, head_dim 16 * 1..8)."""
    return _module.has_prefill_kernel(head_dim)


def paged_prefill_attention(q, key_cache, value_cache, block_tables, starts, counts, scale: float):
    """q [Tp, H, D]: the new tokens of Bp sequences in order, counts[b] of them from position starts[b];
    each attends causally to its sequence's cached context and itself -> [Tp, H, D]."""
    return _module.paged_prefill(q, key_cache, value_cache, block_tables, starts, counts, float(scale))


def add_rms_norm(x, residual, weight, eps: float):
    """x [T, h], residual [T, h] or None -> weight * rms_norm(x + residual) [T, h]; the residual is updated
    in place to x + residual (see RMSNorm.forward for the plain-torch meaning)."""
    return _module.add_rms_norm(x, residual, weight, float(eps))


def rope_write_kv(qkv, positions, cos_table, sin_table, key_cache, value_cache, slot_mapping, num_heads, num_kv_heads):
    """qkv [T, (H + 2 KVH) * D] -> rotated q [T, H, D]; rotated k and v are written to their cache slots."""
    return _module.rope_write_kv(qkv, positions, cos_table, sin_table, key_cache, value_cache, slot_mapping,
                                 num_heads, num_kv_heads)


def silu_mul(gate_up):
    """gate_up [T, 2I] -> silu(gate) * up [T, I]."""
    return _module.silu_mul(gate_up)


def race_sample_logits(logits, inv_temperatures, keys, num_draws: int):
    """logits [S, V] fp32 / bf16 (filtered tokens -inf), inv_temperatures [S] fp32, keys [S] int64 (one per
    row) -> [S, num_draws] token ids drawn from softmax(logits / T): each draw argmax_i logits_i / T - log E_i
    with E_i ~ Exp(1) from a counter-based generator keyed by the row's key, in one pass (no softmax)."""
    return _module.race_sample_logits(logits, inv_temperatures, keys, num_draws)


def transpose_matrix(src):
    """src [R, C] contiguous, 2- or 4-byte elements -> its transpose [C, R], contiguous (cache-sized tiles)."""
    return _module.transpose_matrix(src)


def has_bf16_linear() -> bool:
    """Whether bf16_linear runs here: the kernels compile (on the first call) and the CPU has AVX512-BF16."""
    return available() and _module.has_bf16_linear()


def pack_bf16_linear(weight):
    """weight [N, K] bf16 (K even) -> the [ceil(N / 48), K / 2, 48, 2] layout bf16_linear reads."""
    return _module.pack_bf16_linear(weight)


def bf16_linear(x, packed, out_features: int, bias=None):
    """x [M, K] bf16 -> x @ W^T + bias [M, out_features] bf16, summed in fp32, rounded once."""
    return _module.bf16_linear(x, packed, out_features, bias)
