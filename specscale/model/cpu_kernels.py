"""A C++ paged decode-attention kernel for CPU, compiled on first use with torch's JIT extension loader.

Decode attention reads every context token's K/V once; the plain-torch path first gathers each
sequence's blocks into a dense tensor (a read, a write and a read again), which dominates a decode
iteration at large batches. This kernel reads the blocks in place. When no compiler is available the
engine falls back to the plain-torch path behind the same call (see attention.decode_attention).
"""

from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// Widen one K or V row to fp32 (vectorisable: bf16 is the top half of an fp32).
static inline void widen(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
static inline void widen(const at::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  #pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(raw[i]) << 16;
}
template <typename T>
static inline void widen(const T* src, float* dst, int64_t n) {  // fp16, fp64
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// One task = one (sequence, KV head): its G query heads share every K/V row that is loaded.
// softmax(q.K / sqrt(d)) V over the context, two passes: scores, then the weighted sum of values.
template <typename T>
static void decode_task(const T* q, const T* kc, const T* vc, const int32_t* table, int64_t ctx,
                        T* out, int64_t G, int64_t D, int64_t KVH, int64_t BS, int64_t kh, float scale,
                        std::vector<float>& qf, std::vector<float>& row, std::vector<float>& scores,
                        std::vector<float>& acc) {
  widen(q, qf.data(), G * D);
  for (int64_t i = 0; i < G * D; ++i) qf[i] *= scale;
  scores.resize(G * ctx);
  for (int64_t t0 = 0; t0 < ctx; t0 += BS) {
    const int64_t n = std::min(BS, ctx - t0);
    const int64_t base = static_cast<int64_t>(table[t0 / BS]) * BS;
    for (int64_t t = 0; t < n; ++t) {
      widen(kc + ((base + t) * KVH + kh) * D, row.data(), D);
      const float* k = row.data();
      for (int64_t j = 0; j < G; ++j) {
        const float* qj = qf.data() + j * D;
        float s = 0.f;
        #pragma omp simd reduction(+:s)
        for (int64_t d = 0; d < D; ++d) s += qj[d] * k[d];
        scores[j * ctx + t0 + t] = s;
      }
    }
  }
  std::vector<float> inv_sum(G);
  for (int64_t j = 0; j < G; ++j) {  // p_t = exp(s_t - max) / sum
    float* s = scores.data() + j * ctx;
    const float m = *std::max_element(s, s + ctx);
    float total = 0.f;
    for (int64_t t = 0; t < ctx; ++t) { s[t] = std::exp(s[t] - m); total += s[t]; }
    inv_sum[j] = 1.f / total;
  }
  std::fill(acc.begin(), acc.end(), 0.f);
  for (int64_t t0 = 0; t0 < ctx; t0 += BS) {
    const int64_t n = std::min(BS, ctx - t0);
    const int64_t base = static_cast<int64_t>(table[t0 / BS]) * BS;
    for (int64_t t = 0; t < n; ++t) {
      widen(vc + ((base + t) * KVH + kh) * D, row.data(), D);
      const float* v = row.data();
      for (int64_t j = 0; j < G; ++j) {
        const float p = scores[j * ctx + t0 + t];
        float* a = acc.data() + j * D;
        #pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
      }
    }
  }
  for (int64_t j = 0; j < G; ++j)
    for (int64_t d = 0; d < D; ++d) out[j * D + d] = static_cast<T>(acc[j * D + d] * inv_sum[j]);
}

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor key_cache, torch::Tensor value_cache,
                           torch::Tensor block_tables, torch::Tensor context_lens, double scale) {
  // q [B, H, D]; caches [NB, BS, KVH, D] contiguous; block_tables [B, max_blocks] int32; context_lens [B] int32
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  context_lens = context_lens.contiguous();
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t BS = key_cache.size(1), KVH = key_cache.size(2), G = H / KVH;
  const int64_t max_blocks = block_tables.size(1);
  auto out = torch::empty_like(q);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = context_lens.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = key_cache.data_ptr<scalar_t>();
    const scalar_t* vp = value_cache.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> qf(G * D), row(D), scores, acc(G * D);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / KVH, kh = task % KVH;
        const int64_t offset = (b * H + kh * G) * D;
        decode_task<scalar_t>(qp + offset, kp, vp, tables + b * max_blocks, lens[b], op + offset,
                              G, D, KVH, BS, kh, static_cast<float>(scale), qf, row, scores, acc);
      }
    });
  });
  return out;
}
"""

_lock = threading.Lock()
_module = None
_failed = False


def _build():
    from torch.utils.cpp_extension import load_inline

    flags = ["-O3", "-fopenmp", "-march=native"]
    return load_inline(
        name="specscale_cpu_kernels",
        cpp_sources=[_SOURCE],
        functions=["paged_decode"],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )


def available() -> bool:
    """True once the kernel is compiled and loaded; compiles it on the first call (tens of seconds)."""
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
                log.warning("C++ paged attention unavailable, using the plain torch path: %s", exc)
                _failed = True
    return _module is not None


def paged_decode_attention(q, key_cache, value_cache, block_tables, context_lens, scale: float):
    """q [B, H, D] -> [B, H, D]; reads K/V straight from the paged caches."""
    return _module.paged_decode(q, key_cache, value_cache, block_tables, context_lens, float(scale))
