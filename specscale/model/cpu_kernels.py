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
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

// ---- portable pieces --------------------------------------------------------------------------
// Widen one K or V row to fp32 (bf16 is the top half of an fp32).
static inline void widen(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
static inline void widen(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* raw = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof(float));
  }
}
template <typename T>
static inline void widen(const T* src, float* dst, int64_t n) {  // fp16, fp64
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// softmax over each head's scores in place: p_t = exp(s_t - max) / sum; returns nothing, scales later
static void exp_normalisers(float* scores, int64_t G, int64_t ctx, float* inv_sum);

// ---- AVX-512 pieces: 16 lanes, D a multiple of 16 -----------------------------------------------
#if defined(__AVX512F__)
static inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
template <typename T> static inline __m512 load16(const T* p) {
  float tmp[16];
  widen(p, tmp, 16);
  return _mm512_loadu_ps(tmp);
}
// exp(x) = 2^(x log2 e): integer part through scalef, fraction by a degree-6 polynomial (rel. err ~1e-7)
static inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718055994531f));
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}
#endif

static void exp_normalisers(float* scores, int64_t G, int64_t ctx, float* inv_sum) {
  for (int64_t j = 0; j < G; ++j) {
    float* s = scores + j * ctx;
    const float m = *std::max_element(s, s + ctx);
    float total = 0.f;
    int64_t t = 0;
#if defined(__AVX512F__)
    __m512 sum16 = _mm512_setzero_ps();
    const __m512 m16 = _mm512_set1_ps(m);
    for (; t + 16 <= ctx; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t), m16));
      _mm512_storeu_ps(s + t, e);
      sum16 = _mm512_add_ps(sum16, e);
    }
    total = _mm512_reduce_add_ps(sum16);
#endif
    for (; t < ctx; ++t) { s[t] = std::exp(s[t] - m); total += s[t]; }
    inv_sum[j] = 1.f / total;
  }
}

// Row address of token position t (of this sequence) for KV head kh.
template <typename T>
static inline const T* kv_row(const T* cache, const int32_t* table, int64_t t, int64_t BS, int64_t KVH,
                              int64_t kh, int64_t D) {
  return cache + ((static_cast<int64_t>(table[t / BS]) * BS + t % BS) * KVH + kh) * D;
}

// One task = one (sequence, KV head): its G query heads share every K/V row that is loaded.
// softmax(q.K * scale) V over the context: scores first, then the weighted sum of the values.
template <typename T>
static void decode_task_generic(const T* q, const T* kc, const T* vc, const int32_t* table, int64_t ctx,
                                T* out, int64_t G, int64_t D, int64_t KVH, int64_t BS, int64_t kh, float scale,
                                std::vector<float>& work) {
  work.resize(G * D * 2 + D + G * ctx + G);
  float *qf = work.data(), *acc = qf + G * D, *row = acc + G * D, *scores = row + D, *inv = scores + G * ctx;
  widen(q, qf, G * D);
  for (int64_t i = 0; i < G * D; ++i) qf[i] *= scale;
  for (int64_t t = 0; t < ctx; ++t) {
    widen(kv_row(kc, table, t, BS, KVH, kh, D), row, D);
    for (int64_t j = 0; j < G; ++j) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += qf[j * D + d] * row[d];
      scores[j * ctx + t] = s;
    }
  }
  exp_normalisers(scores, G, ctx, inv);
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t t = 0; t < ctx; ++t) {
    widen(kv_row(vc, table, t, BS, KVH, kh, D), row, D);
    for (int64_t j = 0; j < G; ++j)
      for (int64_t d = 0; d < D; ++d) acc[j * D + d] += scores[j * ctx + t] * row[d];
  }
  for (int64_t j = 0; j < G; ++j)
    for (int64_t d = 0; d < D; ++d) out[j * D + d] = static_cast<T>(acc[j * D + d] * inv[j]);
}

#if defined(__AVX512F__)
// Same computation with K/V rows loaded straight into 16-lane registers (D = 16 * L, L <= 16).
template <typename T>
static void decode_task_avx512(const T* q, const T* kc, const T* vc, const int32_t* table, int64_t ctx,
                               T* out, int64_t G, int64_t D, int64_t KVH, int64_t BS, int64_t kh, float scale,
                               std::vector<float>& work) {
  const int64_t L = D / 16;
  work.resize(G * D * 2 + G * ctx + G);
  float *qf = work.data(), *acc = qf + G * D, *scores = acc + G * D, *inv = scores + G * ctx;
  widen(q, qf, G * D);
  for (int64_t i = 0; i < G * D; ++i) qf[i] *= scale;
  for (int64_t t = 0; t < ctx; ++t) {
    const T* k = kv_row(kc, table, t, BS, KVH, kh, D);
    __m512 kv[16];
    for (int64_t l = 0; l < L; ++l) kv[l] = load16(k + 16 * l);
    for (int64_t j = 0; j < G; ++j) {
      __m512 s = _mm512_setzero_ps();
      for (int64_t l = 0; l < L; ++l) s = _mm512_fmadd_ps(_mm512_loadu_ps(qf + j * D + 16 * l), kv[l], s);
      scores[j * ctx + t] = _mm512_reduce_add_ps(s);
    }
  }
  exp_normalisers(scores, G, ctx, inv);
  std::fill(acc, acc + G * D, 0.f);
  for (int64_t t = 0; t < ctx; ++t) {
    const T* v = kv_row(vc, table, t, BS, KVH, kh, D);
    __m512 vv[16];
    for (int64_t l = 0; l < L; ++l) vv[l] = load16(v + 16 * l);
    for (int64_t j = 0; j < G; ++j) {
      const __m512 p = _mm512_set1_ps(scores[j * ctx + t]);
      float* a = acc + j * D;
      for (int64_t l = 0; l < L; ++l)
        _mm512_storeu_ps(a + 16 * l, _mm512_fmadd_ps(p, vv[l], _mm512_loadu_ps(a + 16 * l)));
    }
  }
  for (int64_t j = 0; j < G; ++j)
    for (int64_t d = 0; d < D; ++d) out[j * D + d] = static_cast<T>(acc[j * D + d] * inv[j]);
}
#endif

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
#if defined(__AVX512F__)
  const bool wide = D % 16 == 0 && D <= 256;
#else
  const bool wide = false;
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode", [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = key_cache.data_ptr<scalar_t>();
    const scalar_t* vp = value_cache.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> work;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / KVH, kh = task % KVH;
        const int64_t offset = (b * H + kh * G) * D;
        const int32_t* table = tables + b * max_blocks;
#if defined(__AVX512F__)
        if (wide) {
          decode_task_avx512<scalar_t>(qp + offset, kp, vp, table, lens[b], op + offset, G, D, KVH, BS, kh,
                                       static_cast<float>(scale), work);
          continue;
        }
#endif
        decode_task_generic<scalar_t>(qp + offset, kp, vp, table, lens[b], op + offset, G, D, KVH, BS, kh,
                                      static_cast<float>(scale), work);
      }
    });
  });
  (void)wide;
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
