#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <type_traits>
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

// Narrow fp32 values to T (round to nearest even, as torch does).
static inline void narrow(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
static inline uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(float));
  if (std::isnan(value)) return 0x7FC0;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
static inline void narrow(const float* src, c10::BFloat16* dst, int64_t n) {
  uint16_t* raw = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) raw[i] = bf16_bits(src[i]);
}
template <typename T>
static inline void narrow(const float* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src[i]);
}

// softmax over each head's scores in place: p_t = exp(s_t - max) / sum; returns nothing, scales later
static void exp_normalisers(float* scores, int64_t G, int64_t ctx, int64_t stride, float* inv_sum);

// q.k taken on bf16 pairs (vdpbf16ps) rather than on widened fp32 rows: bf16 values, D = 16 L a multiple of 32.
template <typename T, int L>
#if defined(__AVX512BF16__)
constexpr bool bf16_pairs = std::is_same_v<T, c10::BFloat16> && L % 2 == 0;
#else
constexpr bool bf16_pairs = false;
#endif

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

static void exp_normalisers(float* scores, int64_t G, int64_t ctx, int64_t stride, float* inv_sum) {
  for (int64_t j = 0; j < G; ++j) {
    float* s = scores + j * stride;
    float m = -INFINITY;
    int64_t t = 0;
#if defined(__AVX512F__)
    __m512 max16 = _mm512_set1_ps(-INFINITY);
    for (; t + 16 <= ctx; t += 16) max16 = _mm512_max_ps(max16, _mm512_loadu_ps(s + t));
    m = _mm512_reduce_max_ps(max16);
#endif
    for (; t < ctx; ++t) m = std::max(m, s[t]);
    float total = 0.f;
    t = 0;
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

// The same addresses for t = 0, 1, 2, ... in order, without a division per token.
template <typename T>
struct KVRowWalker {
  const T* cache;
  const int32_t* table;
  int64_t BS, row_stride, head_offset, block = 0, offset = 0;  // row_stride = KVH * D elements
  const T* next() {
    const T* row = cache + (static_cast<int64_t>(table[block]) * BS + offset) * row_stride + head_offset;
    if (++offset == BS) offset = 0, ++block;
    return row;
  }
};

// Asks for the next `count` rows of a walk into the cache ahead of their use. In a decode step each layer's
// K/V blocks were evicted by the weights streamed through since the previous step, and they sit in
// blocks scattered over the cache, which the hardware prefetchers do not follow.
template <typename T>
static inline void prefetch_rows(KVRowWalker<T>& walk, int64_t count, int64_t D) {
  for (int64_t r = 0; r < count; ++r) {
    const char* row = reinterpret_cast<const char*>(walk.next());
    for (int64_t offset = 0; offset < D * static_cast<int64_t>(sizeof(T)); offset += 64)
      __builtin_prefetch(row + offset);
  }
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
  exp_normalisers(scores, G, ctx, ctx, inv);
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
// Lane i of the result = the sum of the 16 lanes of v[i] (a transposing reduction: 45 shuffles and adds
// for 16 sums instead of a full horizontal reduction each).
static inline __m512 transpose_sum16(const __m512* v) {
  __m512 pairs[8], quads[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit chunk: [a0+a2, b0+b2, a1+a3, b1+b3]
    pairs[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per 128-bit chunk: the chunk's sum for each of 4 vectors
    quads[i] = _mm512_add_ps(_mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(pairs[2 * i], pairs[2 * i + 1], 0xEE));
  const __m512 low = _mm512_add_ps(_mm512_shuffle_f32x4(quads[0], quads[1], 0x88),
                                   _mm512_shuffle_f32x4(quads[0], quads[1], 0xDD));
  const __m512 high = _mm512_add_ps(_mm512_shuffle_f32x4(quads[2], quads[3], 0x88),
                                    _mm512_shuffle_f32x4(quads[2], quads[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

#if defined(__AVX512F__)
// out[h] = inv[h] * sum_t p[h][t] V[t] for HEADS query heads at once (D = 16 L): each V row is widened
// once for all of them and every head's output accumulates in registers.
template <typename T, int L, int HEADS>
static void weighted_values(const T* vc, const int32_t* table, int64_t ctx, int64_t BS, int64_t row_stride,
                            int64_t head_offset, const float* p, int64_t stride, const float* inv, T* out) {
  constexpr int64_t D = 16 * L;
  __m512 acc[HEADS][L];
  for (int h = 0; h < HEADS; ++h)
    for (int l = 0; l < L; ++l) acc[h][l] = _mm512_setzero_ps();
  KVRowWalker<T> values{vc, table, BS, row_stride, head_offset};
  for (int64_t t = 0; t < ctx; ++t) {
    const T* v = values.next();
    __m512 row[L];
    for (int l = 0; l < L; ++l) row[l] = load16(v + 16 * l);
    for (int h = 0; h < HEADS; ++h) {
      const __m512 weight = _mm512_set1_ps(p[h * stride + t]);
      for (int l = 0; l < L; ++l) acc[h][l] = _mm512_fmadd_ps(weight, row[l], acc[h][l]);
    }
  }
  for (int h = 0; h < HEADS; ++h) {
    float result[D];
    const __m512 norm = _mm512_set1_ps(inv[h]);
    for (int l = 0; l < L; ++l) _mm512_storeu_ps(result + 16 * l, _mm512_mul_ps(acc[h][l], norm));
    narrow(result, out + h * D, D);
  }
}
#endif

#if defined(__AVX512BF16__)
// q.k over D = 32 M bf16 values: products of bf16 pairs are exact in fp32, summed in fp32 (vdpbf16ps).
template <int M>
static inline __m512 dot_bf16(const c10::BFloat16* q, const __m512bh* k) {
  __m512 s = _mm512_setzero_ps();
  for (int m = 0; m < M; ++m) s = _mm512_dpbf16_ps(s, (__m512bh)_mm512_loadu_si512(q + 32 * m), k[m]);
  return s;
}
#endif

// Same computation for D = 16 * L: K rows are loaded once for the G query heads, scores of 16 tokens
// are reduced together, and each head's output accumulates in L registers over the values. In bf16
// with an even L, q.k is taken on the bf16 pairs directly (no widening of K) and scaled after the sum.
template <typename T, int L>
static void decode_task_avx512(const T* q, const T* kc, const T* vc, const int32_t* table, int64_t ctx,
                               T* out, int64_t G, int64_t /*D = 16 L*/, int64_t KVH, int64_t BS, int64_t kh,
                               float scale, std::vector<float>& work) {
  constexpr int64_t D = 16 * L;
  const int64_t stride = (ctx + 15) / 16 * 16;  // scores of one head, padded to whole 16-token chunks
  work.resize(G * D + G * stride + G * 16 * 16 + G);
  // partial: [G][16 tokens][16 lanes] dot products of one chunk before their reduction
  float *qf = work.data(), *scores = qf + G * D, *partial = scores + G * stride, *inv = partial + G * 16 * 16;
  constexpr bool pairs = bf16_pairs<T, L>;
  if constexpr (!pairs) {
    widen(q, qf, G * D);
    for (int64_t i = 0; i < G * D; ++i) qf[i] *= scale;
  }
  KVRowWalker<T> keys{kc, table, BS, KVH * D, kh * D};
  KVRowWalker<T> keys_ahead{kc, table, BS, KVH * D, kh * D}, values_ahead{vc, table, BS, KVH * D, kh * D};
  prefetch_rows<T>(keys_ahead, std::min<int64_t>(16, ctx), D);
  const __m512 score_scale = _mm512_set1_ps(pairs ? scale : 1.f);
  for (int64_t t0 = 0; t0 < ctx; t0 += 16) {
    const int64_t n = std::min<int64_t>(16, ctx - t0);
    prefetch_rows<T>(keys_ahead, std::min<int64_t>(16, ctx - t0 - n), D);  // the next chunk's keys
    prefetch_rows<T>(values_ahead, n, D);  // this chunk's values, read after the softmax
#if defined(__AVX512BF16__)
    if constexpr (pairs) {
      for (int64_t i = 0; i < 16; ++i) {
        __m512bh kb[L / 2];
        const T* k = i < n ? keys.next() : nullptr;
        for (int m = 0; m < L / 2; ++m)  // padding tokens score 0, never read
          kb[m] = (__m512bh)(k != nullptr ? _mm512_loadu_si512(k + 32 * m) : _mm512_setzero_si512());
        for (int64_t j = 0; j < G; ++j)
          _mm512_storeu_ps(partial + (j * 16 + i) * 16, dot_bf16<L / 2>(reinterpret_cast<const c10::BFloat16*>(q) + j * D, kb));
      }
    }
#endif
    for (int64_t i = 0; i < 16 && !pairs; ++i) {
      __m512 kv[L];
      if (i < n) {
        const T* k = keys.next();
        for (int l = 0; l < L; ++l) kv[l] = load16(k + 16 * l);
      } else {
        for (int l = 0; l < L; ++l) kv[l] = _mm512_setzero_ps();  // padding tokens score 0, never read
      }
      for (int64_t j = 0; j < G; ++j) {
        const float* qj = qf + j * D;
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qj), kv[0]);
        for (int l = 1; l < L; ++l) s = _mm512_fmadd_ps(_mm512_loadu_ps(qj + 16 * l), kv[l], s);
        _mm512_storeu_ps(partial + (j * 16 + i) * 16, s);
      }
    }
    for (int64_t j = 0; j < G; ++j) {
      __m512 rows[16];
      for (int i = 0; i < 16; ++i) rows[i] = _mm512_loadu_ps(partial + (j * 16 + i) * 16);
      _mm512_storeu_ps(scores + j * stride + t0, _mm512_mul_ps(transpose_sum16(rows), score_scale));
    }
  }
  exp_normalisers(scores, G, ctx, stride, inv);
  // HEADS heads' accumulators (HEADS L registers) and a V row (L) within 32 registers: every V row is read
  // once per HEADS heads (4 for head_dim <= 64: a 7-head group reads the values twice, not four times)
  int64_t j = 0;
  if constexpr (L <= 4)
    for (; j + 4 <= G; j += 4)
      weighted_values<T, L, 4>(vc, table, ctx, BS, KVH * D, kh * D, scores + j * stride, stride, inv + j, out + j * D);
  if constexpr (L <= 5)
    for (; j + 3 <= G; j += 3)
      weighted_values<T, L, 3>(vc, table, ctx, BS, KVH * D, kh * D, scores + j * stride, stride, inv + j, out + j * D);
  if constexpr (L <= 8)
    for (; j + 2 <= G; j += 2)
      weighted_values<T, L, 2>(vc, table, ctx, BS, KVH * D, kh * D, scores + j * stride, stride, inv + j, out + j * D);
  for (; j < G; ++j)
    weighted_values<T, L, 1>(vc, table, ctx, BS, KVH * D, kh * D, scores + j * stride, stride, inv + j, out + j * D);
}
#endif

template <typename T>
using DecodeTask = void (*)(const T*, const T*, const T*, const int32_t*, int64_t, T*, int64_t, int64_t, int64_t,
                            int64_t, int64_t, float, std::vector<float>&);

// The AVX-512 task for D = 16 L (L = 1..8 or 16), else the portable one.
template <typename T>
static DecodeTask<T> pick_decode_task(int64_t D) {
#if defined(__AVX512F__)
  switch (D) {
    case 16: return decode_task_avx512<T, 1>;
    case 32: return decode_task_avx512<T, 2>;
    case 48: return decode_task_avx512<T, 3>;
    case 64: return decode_task_avx512<T, 4>;
    case 80: return decode_task_avx512<T, 5>;
    case 96: return decode_task_avx512<T, 6>;
    case 112: return decode_task_avx512<T, 7>;
    case 128: return decode_task_avx512<T, 8>;
    case 256: return decode_task_avx512<T, 16>;
  }
#endif
  return decode_task_generic<T>;
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
    const DecodeTask<scalar_t> task_fn = pick_decode_task<scalar_t>(D);
    at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> work;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / KVH, kh = task % KVH;
        if (task + 1 < end) {  // the next task's first keys, while this one runs
          const int64_t next_b = (task + 1) / KVH;
          KVRowWalker<scalar_t> next_keys{kp, tables + next_b * max_blocks, BS, KVH * D, (task + 1) % KVH * D};
          prefetch_rows<scalar_t>(next_keys, std::min<int64_t>(16, lens[next_b]), D);
        }
        const int64_t offset = (b * H + kh * G) * D;
        task_fn(qp + offset, kp, vp, tables + b * max_blocks, lens[b], op + offset, G, D, KVH, BS, kh,
                static_cast<float>(scale), work);
      }
    });
  });
  return out;
}

// ==== Paged prefill attention (AVX-512) ============================================================
// One task = one (sequence, KV head): its new tokens (positions start .. start + n - 1) attend causally to
// the cached context plus themselves, all already in the paged cache. The task lays out the K rows it needs
// once, transposed in 16-key blocks (so a query's scores for 16 keys come out in one register without a
// horizontal sum), and the V rows widened to fp32; then each query row (token, head) computes its scores,
// a softmax over its keys 0 .. its position, and the weighted sum of the values.
#if defined(__AVX512F__)
// Query heads served together by one pass over a token's keys and values: the weighted sum keeps
// HEADS x L accumulators and L value vectors in the 32 registers.
template <int L>
constexpr int max_prefill_heads = std::min(8, 24 / L);
// Key blocks scored together for HEADS heads: HEADS x KB accumulators and KB key vectors in registers.
template <int HEADS>
constexpr int score_key_blocks = std::min(8, 30 / (HEADS + 1));

// scores[h][16 b .. 16 (b + KB)) = scale * q_h . k for the KB blocks of 16 keys from block b0: every K word
// is loaded once for the HEADS heads, every query word once for the KB blocks.
template <typename T, int L, int HEADS, int KB>
static inline void score_key_blocks_pass(const T* query, const float* qf, const float* transposed, int64_t b0,
                                         float scale, float* scores, int64_t stride) {
  constexpr int64_t D = 16 * L;
  constexpr bool pairs = bf16_pairs<T, L>;
  constexpr int64_t lanes_per_key = pairs ? D / 2 : D;
  const float* blocks = transposed + b0 * lanes_per_key * 16;
  __m512 s[HEADS][KB];
  for (int h = 0; h < HEADS; ++h)
    for (int j = 0; j < KB; ++j) s[h][j] = _mm512_setzero_ps();
  for (int64_t w = 0; w < lanes_per_key; ++w) {
    __m512 k[KB];  // word w of 16 keys, for each block
    for (int j = 0; j < KB; ++j) k[j] = _mm512_loadu_ps(blocks + (j * lanes_per_key + w) * 16);
    for (int h = 0; h < HEADS; ++h) {
#if defined(__AVX512BF16__)
      if constexpr (pairs) {
        const __m512bh qw = (__m512bh)_mm512_set1_epi32(reinterpret_cast<const int32_t*>(query + h * D)[w]);
        for (int j = 0; j < KB; ++j) s[h][j] = _mm512_dpbf16_ps(s[h][j], qw, (__m512bh)k[j]);  // += q_2w k_2w + q_2w+1 k_2w+1
      }
#endif
      if constexpr (!pairs) {
        const __m512 qw = _mm512_set1_ps(qf[h * D + w]);
        for (int j = 0; j < KB; ++j) s[h][j] = _mm512_fmadd_ps(qw, k[j], s[h][j]);
      }
    }
  }
  for (int h = 0; h < HEADS; ++h)
    for (int j = 0; j < KB; ++j)
      _mm512_storeu_ps(scores + h * stride + (b0 + j) * 16, _mm512_mul_ps(s[h][j], _mm512_set1_ps(scale)));
}

// HEADS query rows of one token (same visible keys): scores against the transposed K blocks, softmax, and
// the weighted sum of the widened values; every K word and V row loaded once serves all HEADS rows.
template <typename T, int L, int HEADS>
static void prefill_rows(const T* query, const float* transposed, const float* values, int64_t visible, float scale,
                         float* scores, float* qf, T* out) {
  constexpr int64_t D = 16 * L;
  constexpr int KB = score_key_blocks<HEADS>;
  const int64_t blocks = (visible + 15) / 16, stride = blocks * 16;
  if constexpr (!bf16_pairs<T, L>) widen(query, qf, HEADS * D);
  int64_t b = 0;
  for (; b + KB <= blocks; b += KB) score_key_blocks_pass<T, L, HEADS, KB>(query, qf, transposed, b, scale, scores, stride);
  for (; b < blocks; ++b) score_key_blocks_pass<T, L, HEADS, 1>(query, qf, transposed, b, scale, scores, stride);
  float inv[HEADS];
  exp_normalisers(scores, HEADS, visible, stride, inv);
  __m512 acc[HEADS][L];
  for (int h = 0; h < HEADS; ++h)
    for (int l = 0; l < L; ++l) acc[h][l] = _mm512_setzero_ps();
  for (int64_t k = 0; k < visible; ++k) {
    __m512 row[L];
    for (int l = 0; l < L; ++l) row[l] = _mm512_loadu_ps(values + k * D + 16 * l);
    for (int h = 0; h < HEADS; ++h) {
      const __m512 weight = _mm512_set1_ps(scores[h * stride + k]);
      for (int l = 0; l < L; ++l) acc[h][l] = _mm512_fmadd_ps(weight, row[l], acc[h][l]);
    }
  }
  for (int h = 0; h < HEADS; ++h) {
    float result[D];
    for (int l = 0; l < L; ++l) _mm512_storeu_ps(result + 16 * l, _mm512_mul_ps(acc[h][l], _mm512_set1_ps(inv[h])));
    narrow(result, out + h * D, D);
  }
}

template <typename T, int L>
using PrefillRows = void (*)(const T*, const float*, const float*, int64_t, float, float*, float*, T*);

// prefill_rows for 1 .. max_prefill_heads<L> heads at a time (index = heads; nullptr beyond).
template <typename T, int L, int HEADS>
constexpr PrefillRows<T, L> prefill_rows_for() {
  if constexpr (HEADS <= max_prefill_heads<L>) return prefill_rows<T, L, HEADS>;
  return nullptr;
}
template <typename T, int L>
static constexpr PrefillRows<T, L> prefill_rows_by_heads[9] = {
    nullptr, prefill_rows_for<T, L, 1>(), prefill_rows_for<T, L, 2>(), prefill_rows_for<T, L, 3>(),
    prefill_rows_for<T, L, 4>(), prefill_rows_for<T, L, 5>(), prefill_rows_for<T, L, 6>(),
    prefill_rows_for<T, L, 7>(), prefill_rows_for<T, L, 8>()};
#endif

#if defined(__AVX512F__)
template <typename T, int L>
static void prefill_task(const T* q, int64_t H, const T* kc, const T* vc, const int32_t* table, int64_t BS,
                         int64_t KVH, int64_t kh, int64_t G, int64_t start, int64_t first_token, int64_t n,
                         float scale, T* out, std::vector<float>& work) {
  constexpr int64_t D = 16 * L;
  constexpr bool pairs = bf16_pairs<T, L>;
  constexpr int64_t lanes_per_key = pairs ? D / 2 : D;  // 32-bit words per key in the transposed blocks
  const int64_t keys = start + n, blocks = (keys + 15) / 16;
  constexpr int most = max_prefill_heads<L>;
  work.resize(blocks * lanes_per_key * 16 + keys * D + most * blocks * 16 + most * D);
  float* transposed = work.data();                        // [blocks][lanes_per_key][16 keys]
  float* values = transposed + blocks * lanes_per_key * 16;  // [keys][D] fp32
  float* scores = values + keys * D;                      // [most][blocks * 16]
  float* qf = scores + most * blocks * 16;                // [most][D] query rows widened (fp32 path)
  uint32_t* words = reinterpret_cast<uint32_t*>(transposed);
  KVRowWalker<T> key_rows{kc, table, BS, KVH * D, kh * D}, value_rows{vc, table, BS, KVH * D, kh * D};
  for (int64_t k = 0; k < blocks * 16; ++k) {
    const int64_t block = k / 16, lane = k % 16;
    float* column = transposed + block * lanes_per_key * 16 + lane;
    if (k >= keys) {
      for (int64_t w = 0; w < lanes_per_key; ++w) column[w * 16] = 0.f;
      continue;
    }
    const T* key = key_rows.next();
    if constexpr (pairs) {
      uint32_t word;
      for (int64_t w = 0; w < lanes_per_key; ++w) std::memcpy(&word, key + 2 * w, 4), words[column - transposed + w * 16] = word;
    } else {
      float row[D];
      widen(key, row, D);
      for (int64_t d = 0; d < D; ++d) column[d * 16] = row[d];
    }
    widen(value_rows.next(), values + k * D, D);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t visible = start + i + 1;  // keys 0 .. its position
    const T* query = q + ((first_token + i) * H + kh * G) * D;
    T* result = out + ((first_token + i) * H + kh * G) * D;
    const int64_t passes = (G + most - 1) / most;  // the G heads in passes of near-equal size
    for (int64_t p = 0, j = 0; p < passes; ++p) {
      const int64_t heads = G * (p + 1) / passes - j;
      prefill_rows_by_heads<T, L>[heads](query + j * D, transposed, values, visible, scale, scores, qf, result + j * D);
      j += heads;
    }
  }
}
#endif

template <typename T>
using PrefillTask = void (*)(const T*, int64_t, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, int64_t, float, T*, std::vector<float>&);

// The AVX-512 task for D = 16 L (L = 1..8), else none (the caller keeps the torch path).
template <typename T>
static PrefillTask<T> pick_prefill_task(int64_t D) {
#if defined(__AVX512F__)
  switch (D) {
    case 16: return prefill_task<T, 1>;
    case 32: return prefill_task<T, 2>;
    case 48: return prefill_task<T, 3>;
    case 64: return prefill_task<T, 4>;
    case 80: return prefill_task<T, 5>;
    case 96: return prefill_task<T, 6>;
    case 112: return prefill_task<T, 7>;
    case 128: return prefill_task<T, 8>;
  }
#endif
  return nullptr;
}

bool has_prefill_kernel(int64_t head_dim) { return pick_prefill_task<float>(head_dim) != nullptr; }

torch::Tensor paged_prefill(torch::Tensor q, torch::Tensor key_cache, torch::Tensor value_cache,
                            torch::Tensor block_tables, torch::Tensor starts, torch::Tensor counts, double scale) {
  // q [Tp, H, D] the new tokens of Bp sequences in order; block_tables [Bp, max_blocks] int32;
  // starts [Bp] int64 position of each sequence's first new token; counts [Bp] int64 its new tokens
  q = q.contiguous();
  block_tables = block_tables.contiguous();
  starts = starts.contiguous();
  counts = counts.contiguous();
  const int64_t H = q.size(1), D = q.size(2), sequences = starts.size(0);
  const int64_t BS = key_cache.size(1), KVH = key_cache.size(2), G = H / KVH;
  const int64_t max_blocks = block_tables.size(1);
  const int64_t* sp = starts.data_ptr<int64_t>();
  const int64_t* cp = counts.data_ptr<int64_t>();
  std::vector<int64_t> first_token(sequences + 1, 0);
  for (int64_t b = 0; b < sequences; ++b) first_token[b + 1] = first_token[b] + cp[b];
  TORCH_CHECK(first_token[sequences] == q.size(0), "paged_prefill: counts do not add up to the query rows");
  auto out = torch::empty_like(q);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_prefill", [&] {
    const PrefillTask<scalar_t> task_fn = pick_prefill_task<scalar_t>(D);
    TORCH_CHECK(task_fn != nullptr, "paged_prefill: no kernel for head_dim ", D);
    const scalar_t* qp = q.data_ptr<scalar_t>();
    at::parallel_for(0, sequences * KVH, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> work;
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / KVH, kh = task % KVH;
        task_fn(qp, H, key_cache.data_ptr<scalar_t>(), value_cache.data_ptr<scalar_t>(), tables + b * max_blocks,
                BS, KVH, kh, G, sp[b], first_token[b], cp[b], static_cast<float>(scale), out.data_ptr<scalar_t>(),
                work);
      }
    });
  });
  return out;
}

// ==== Fused elementwise kernels ===================================================================
// Each replaces a chain of small torch ops whose per-call overhead dominates a decode iteration of a
// small model. They compute in fp32 and round to the activation dtype T exactly where the plain-torch
// path (model/transformer.py) rounds, so both paths agree to the last bit in fp32 and to about one
// unit in the last place in bf16/fp16 (where only the order of a sum may differ).
//
// fp32 and bf16 rows run 16 lanes at a time on AVX-512 (a masked last chunk for the tail, no scratch
// buffers); fp16 and builds without AVX-512 take the portable row functions. A call forks threads only
// when it has enough elements to repay the fork (rows_per_task): a decode step's calls are small.

// Round fp32 values in place to what T can hold (a no-op for fp32): the rounding of one torch op in T.
template <typename T>
static inline void round_to(float* values, int64_t n) {
  if constexpr (std::is_same_v<T, float>) return;
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(bf16_bits(values[i])) << 16;
      std::memcpy(values + i, &bits, sizeof(float));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<float>(static_cast<T>(values[i]));
}

// Rows per parallel task so that a task covers at least task_elements() elements of its call: a call with
// fewer runs on the calling thread alone. Waking sleeping OpenMP threads (OMP_WAIT_POLICY=PASSIVE, the
// package's default) costs tens of microseconds, spinning ones (ACTIVE) about one (docs/BENCHMARKS.md,
// "Spinning OpenMP waits"): a [32, 896] norm is ~10 us on one thread, ~7 us on two spinning ones.
static int64_t task_elements() {
  static const int64_t elements = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy != nullptr && strcasecmp(policy, "ACTIVE") == 0 ? int64_t{16 * 1024} : int64_t{64 * 1024};
  }();
  return elements;
}
static inline int64_t rows_per_task(int64_t elements_per_row) {
  return std::max<int64_t>(1, task_elements() / std::max<int64_t>(1, elements_per_row));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// The types whose rows run 16 lanes at a time.
template <typename T>
constexpr bool lanes16 = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

static inline __mmask16 first_lanes(int64_t n) { return n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1); }

// Elements [0, min(n, 16)) of p widened to fp32 (the other lanes are 0 and nothing past p + n is read).
// Only a row's last chunk is masked: masked loads and stores are slower on some CPUs (AMD Zen 4).
static inline __m512 load_n(const float* p, int64_t n) {
  return n >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(first_lanes(n), p);
}
static inline __m512 load_n(const c10::BFloat16* p, int64_t n) {
  const __m256i raw = n >= 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                              : _mm256_maskz_loadu_epi16(first_lanes(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// Each lane rounded to bf16 as bf16_bits rounds (nearest even, NaN -> 0x7FC0), kept in the top 16 bits.
static inline __m512i bf16_rounded_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))), nan,
                               _mm512_set1_epi32(0x7FC00000));
}

// The 16 bf16 values of bf16_rounded_bits. These kernels are bound by vector instructions, and rounding
// the integer way takes 9: where the CPU has it, vcvtneps2bf16 does the same rounding (nearest even) in
// one, except that it flushes subnormal inputs to zero and keeps a NaN's payload; vectors with either
// (fpclass: QNaN 0x01, subnormal 0x20, SNaN 0x80) take the integer way, so the bits are the same.
static inline __m256i bf16_halves(__m512 v) {
#if defined(__AVX512BF16__)
  if (_mm512_fpclass_ps_mask(v, 0xA1) == 0) return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
#endif
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_rounded_bits(v), 16));
}

// round_to for 16 lanes.
template <typename T>
static inline __m512 round16(__m512 v) {
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16_halves(v)), 16));
  return v;
}

// Lanes [0, min(n, 16)) of v, already rounded to T (round16), narrowed and stored at p.
static inline void store_rounded_n(float* p, __m512 v, int64_t n) {
  if (n >= 16) return _mm512_storeu_ps(p, v);
  _mm512_mask_storeu_ps(p, first_lanes(n), v);
}
static inline void store_rounded_n(c10::BFloat16* p, __m512 v, int64_t n) {
  const __m256i halves = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
  if (n >= 16) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), halves);
  _mm256_mask_storeu_epi16(p, first_lanes(n), halves);
}
// The same for any fp32 lanes: rounded to T, then stored.
static inline void store_n(float* p, __m512 v, int64_t n) { store_rounded_n(p, v, n); }
static inline void store_n(c10::BFloat16* p, __m512 v, int64_t n) {
  const __m256i halves = bf16_halves(v);
  if (n >= 16) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), halves);
  _mm256_mask_storeu_epi16(p, first_lanes(n), halves);
}
#else
template <typename T>
constexpr bool lanes16 = false;
#endif

// ---- residual add + RMSNorm ----
// residual' = x + residual (rounded to T), out = weight * rms_norm(residual'):
//   fp32: x * rsqrt(mean(x^2) + eps) * w;  bf16/fp16: normalise in fp32, round to T, then scale by w.
// Without a residual (nullptr), residual' is x itself. The residual row is updated in place.
template <typename T>
static void add_rms_norm_row_portable(const T* x, T* residual, const T* weight, T* out, int64_t h, float eps) {
  thread_local std::vector<float> buffers;
  buffers.resize(3 * h);
  float *row = buffers.data(), *w = row + h, *other = w + h;
  widen(weight, w, h);
  widen(x, row, h);
  if (residual != nullptr) {
    widen(residual, other, h);
    for (int64_t i = 0; i < h; ++i) row[i] += other[i];
    round_to<T>(row, h);
    narrow(row, residual, h);
  }
  float sum = 0.f;
  for (int64_t i = 0; i < h; ++i) sum += row[i] * row[i];
  const float inv_rms = 1.f / std::sqrt(sum / static_cast<float>(h) + eps);
  for (int64_t i = 0; i < h; ++i) row[i] *= inv_rms;
  round_to<T>(row, h);
  for (int64_t i = 0; i < h; ++i) row[i] *= w[i];
  narrow(row, out, h);
}

template <typename T>
static void add_rms_norm_row(const T* x, T* residual, const T* weight, T* out, int64_t h, float eps) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (lanes16<T>) {
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < h; i += 16) {  // the add (rounded to T), written back, and the sum of squares
      __m512 v = load_n(x + i, h - i);
      if (residual != nullptr) {
        v = round16<T>(_mm512_add_ps(v, load_n(residual + i, h - i)));
        store_rounded_n(residual + i, v, h - i);
      }
      squares = _mm512_fmadd_ps(v, v, squares);
    }
    const float inv_rms = 1.f / std::sqrt(_mm512_reduce_add_ps(squares) / static_cast<float>(h) + eps);
    const __m512 scale = _mm512_set1_ps(inv_rms);
    const T* normed = residual != nullptr ? residual : x;  // residual' as just stored (exactly v above)
    for (int64_t i = 0; i < h; i += 16) {
      const __m512 v = round16<T>(_mm512_mul_ps(load_n(normed + i, h - i), scale));
      store_n(out + i, _mm512_mul_ps(v, load_n(weight + i, h - i)), h - i);
    }
    return;
  }
#endif
  add_rms_norm_row_portable(x, residual, weight, out, h, eps);
}

torch::Tensor add_rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor weight,
                           double eps) {
  // x, residual [T, h] contiguous; weight [h]
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous(), "add_rms_norm: contiguous inputs expected");
  const int64_t rows = x.size(0), h = x.size(1);
  auto out = torch::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "add_rms_norm", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    const scalar_t* wp = weight.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, rows_per_task(h), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r)
        add_rms_norm_row(xp + r * h, rp == nullptr ? nullptr : rp + r * h, wp, op + r * h, h,
                         static_cast<float>(eps));
    });
  });
  return out;
}

// ---- RoPE + KV-cache write ----
// Rotate-half RoPE of one head in fp32 with T's roundings: y = x*cos + rotate_half(x)*sin, where
// rotate_half(x) = [-x[half:], x[:half]].
template <typename T>
static void rotate_head_portable(const T* head, const float* cos, const float* sin, int64_t D, T* dst) {
  thread_local std::vector<float> buffers;
  buffers.resize(3 * D);
  float *x = buffers.data(), *a = x + D, *b = a + D;
  widen(head, x, D);
  const int64_t half = D / 2;
  for (int64_t i = 0; i < D; ++i) {
    const float rotated = i < half ? -x[i + half] : x[i - half];
    a[i] = x[i] * cos[i];
    b[i] = rotated * sin[i];
  }
  round_to<T>(a, D);
  round_to<T>(b, D);
  for (int64_t i = 0; i < D; ++i) x[i] = a[i] + b[i];
  narrow(x, dst, D);
}

// The same for one token's heads (count of them, D apart) with cos / sin straight from T's tables:
// y_low = x_low*cos_low - x_high*sin_low, y_high = x_high*cos_high + x_low*sin_high, each product rounded
// to T (-(x*s) rounds as x*s does, and a + (-b) is a - b).
template <typename T>
static void rotate_heads(const T* heads, const T* cos, const T* sin, int64_t count, int64_t D, T* const* dsts) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (lanes16<T>) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i += 16) {
      const int64_t n = half - i;
      const __m512 cos_low = load_n(cos + i, n), cos_high = load_n(cos + half + i, n);
      const __m512 sin_low = load_n(sin + i, n), sin_high = load_n(sin + half + i, n);
      for (int64_t h = 0; h < count; ++h) {
        const __m512 low = load_n(heads + h * D + i, n), high = load_n(heads + h * D + half + i, n);
        const __m512 y_low = _mm512_sub_ps(round16<T>(_mm512_mul_ps(low, cos_low)),
                                           round16<T>(_mm512_mul_ps(high, sin_low)));
        const __m512 y_high = _mm512_add_ps(round16<T>(_mm512_mul_ps(high, cos_high)),
                                            round16<T>(_mm512_mul_ps(low, sin_high)));
        store_n(dsts[h] + i, y_low, n);
        store_n(dsts[h] + half + i, y_high, n);
      }
    }
    return;
  }
#endif
  thread_local std::vector<float> table_rows;
  table_rows.resize(2 * D);
  widen(cos, table_rows.data(), D);
  widen(sin, table_rows.data() + D, D);
  for (int64_t h = 0; h < count; ++h)
    rotate_head_portable(heads + h * D, table_rows.data(), table_rows.data() + D, D, dsts[h]);
}

// From the fused qkv projection [T, (H + 2 KVH) * D]: rotate q and k at each token's position, write
// k and v into their cache slots, return q [T, H, D].
torch::Tensor rope_write_kv(torch::Tensor qkv, torch::Tensor positions, torch::Tensor cos_table,
                            torch::Tensor sin_table, torch::Tensor key_cache, torch::Tensor value_cache,
                            torch::Tensor slot_mapping, int64_t H, int64_t KVH) {
  // positions, slot_mapping [T] int64; cos/sin tables [P, D]; caches [NB, BS, KVH, D] contiguous
  TORCH_CHECK(qkv.is_contiguous() && key_cache.is_contiguous() && value_cache.is_contiguous() &&
              cos_table.is_contiguous() && sin_table.is_contiguous(), "rope_write_kv: contiguous inputs expected");
  positions = positions.contiguous();
  slot_mapping = slot_mapping.contiguous();
  const int64_t tokens = qkv.size(0), D = cos_table.size(1), width = qkv.size(1);
  TORCH_CHECK(width == (H + 2 * KVH) * D, "rope_write_kv: qkv width does not match the heads");
  auto q = torch::empty({tokens, H, D}, qkv.options());
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "rope_write_kv", [&] {
    const scalar_t* in = qkv.data_ptr<scalar_t>();
    const scalar_t* cp = cos_table.data_ptr<scalar_t>();
    const scalar_t* sp = sin_table.data_ptr<scalar_t>();
    scalar_t* kc = key_cache.data_ptr<scalar_t>();
    scalar_t* vc = value_cache.data_ptr<scalar_t>();
    scalar_t* qp = q.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, rows_per_task(width), [&](int64_t begin, int64_t end) {
      thread_local std::vector<scalar_t*> dsts;
      dsts.resize(H + KVH);
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t h = 0; h < H + KVH; ++h)  // q heads to q, then k heads to their cache slot
          dsts[h] = h < H ? qp + (t * H + h) * D : kc + (slots[t] * KVH + (h - H)) * D;
        rotate_heads(in + t * width, cp + pos[t] * D, sp + pos[t] * D, H + KVH, D, dsts.data());
        std::memcpy(vc + slots[t] * KVH * D, in + t * width + (H + KVH) * D, KVH * D * sizeof(scalar_t));
      }
    });
  });
  return q;
}

// ---- silu(gate) * up ----
// silu(gate) * up from the fused gate_up projection [T, 2I] -> [T, I]; silu(x) = x / (1 + exp(-x)),
// rounded to T before the product, as F.silu(gate) * up rounds.
template <typename T>
static void silu_mul_row_portable(const T* gate_up, T* out, int64_t I) {
  thread_local std::vector<float> buffers;
  buffers.resize(2 * I);
  float *gate = buffers.data(), *up = gate + I;
  widen(gate_up, gate, I);
  widen(gate_up + I, up, I);
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= I; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    _mm512_storeu_ps(gate + i, _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
  }
#endif
  for (; i < I; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i]));
  round_to<T>(gate, I);
  for (int64_t j = 0; j < I; ++j) gate[j] *= up[j];
  narrow(gate, out, I);
}

template <typename T>
static void silu_mul_row(const T* gate_up, T* out, int64_t I) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  if constexpr (lanes16<T>) {
    const __m512 one = _mm512_set1_ps(1.f);
    for (int64_t i = 0; i < I; i += 16) {
      const __m512 gate = load_n(gate_up + i, I - i), up = load_n(gate_up + I + i, I - i);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gate));
      const __m512 silu = round16<T>(_mm512_div_ps(gate, _mm512_add_ps(one, e)));
      store_n(out + i, _mm512_mul_ps(silu, up), I - i);
    }
    return;
  }
#endif
  silu_mul_row_portable(gate_up, out, I);
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.is_contiguous() && gate_up.size(1) % 2 == 0, "silu_mul: contiguous [T, 2I] expected");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({rows, I}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, gate_up.scalar_type(), "silu_mul", [&] {
    const scalar_t* in = gate_up.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, rows, rows_per_task(4 * I), [&](int64_t begin, int64_t end) {  // exp: ~4x a norm's work
      for (int64_t r = begin; r < end; ++r) silu_mul_row<scalar_t>(in + r * 2 * I, op + r * I, I);
    });
  });
  return out;
}

// ==== Sampling: the exponential race in one pass ===================================================
// token = argmax_i p_i / E_i with E_i = -log(U_i) ~ Exp(1) (engine/sampler.py states why this draws from p).
// U_i comes from a counter-based generator: the top 24 bits of SplitMix64(key + c * golden) for counter
// c = draw * V + i, mapped to (k + 0.5) / 2^24, so U is never 0 or 1 and has float32's resolution.
static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
static inline uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static inline float uniform_of(uint64_t bits) { return (static_cast<float>(bits >> 40) + 0.5f) * 0x1p-24f; }

#if defined(__AVX512F__) && defined(__AVX512DQ__)
static inline __m512i splitmix64_8(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), _mm512_set1_epi64(0xBF58476D1CE4E5B9ll));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), _mm512_set1_epi64(0x94D049BB133111EBll));
  return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}
// The top 24 bits k of the generator's 16 draws for counters c0 .. c0 + 15 (U = (k + 0.5) / 2^24).
static inline __m512i draws16(uint64_t key, uint64_t c0) {
  const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i golden = _mm512_set1_epi64(static_cast<long long>(kGolden));
  const __m512i base = _mm512_set1_epi64(static_cast<long long>(key + c0 * kGolden));
  const __m512i low = _mm512_add_epi64(base, _mm512_mullo_epi64(lane, golden));
  const __m512i high = _mm512_add_epi64(low, _mm512_set1_epi64(static_cast<long long>(8 * kGolden)));
  const __m256i k_low = _mm512_cvtepi64_epi32(_mm512_srli_epi64(splitmix64_8(low), 40));
  const __m256i k_high = _mm512_cvtepi64_epi32(_mm512_srli_epi64(splitmix64_8(high), 40));
  return _mm512_inserti64x4(_mm512_castsi256_si512(k_low), k_high, 1);
}
// U = (k + 0.5) / 2^24 for 16 draws, rounded as uniform_of rounds (k < 2^24 converts exactly)
static inline __m512 uniform16(__m512i k) {
  return _mm512_mul_ps(_mm512_add_ps(_mm512_cvtepi32_ps(k), _mm512_set1_ps(0.5f)), _mm512_set1_ps(0x1p-24f));
}
// log(x) for x in (0, 1]: x = m 2^e with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m-1)/(m+1),
// by its series to s^9 (|s| <= 0.172: relative error ~1e-9 before float rounding).
static inline __m512 log16(__m512 x) {
  __m512 e = _mm512_getexp_ps(x);
  __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
  m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
  e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.f));
  const __m512 s = _mm512_div_ps(_mm512_sub_ps(m, _mm512_set1_ps(1.f)), _mm512_add_ps(m, _mm512_set1_ps(1.f)));
  const __m512 s2 = _mm512_mul_ps(s, s);
  __m512 poly = _mm512_set1_ps(2.f / 9);
  poly = _mm512_fmadd_ps(poly, s2, _mm512_set1_ps(2.f / 7));
  poly = _mm512_fmadd_ps(poly, s2, _mm512_set1_ps(2.f / 5));
  poly = _mm512_fmadd_ps(poly, s2, _mm512_set1_ps(2.f / 3));
  poly = _mm512_fmadd_ps(poly, s2, _mm512_set1_ps(2.f));
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.69314718055994531f), _mm512_mul_ps(poly, s));
}
// G(U) = log(-log U) of 16 draws, the noise a score subtracts: score = l / T - G(U).
static inline __m512 race_noise16(__m512i k) {
  return log16(_mm512_sub_ps(_mm512_setzero_ps(), log16(uniform16(k))));
}

// Pruning that leaves the winner as it is. G decreases in U, so within a run of logits whose largest
// l / T is A, a draw with U < u = exp(-exp(A - best + slack)) scores below `best`, the best score so far,
// and neither it nor anything after it can make it the winner (the winner is the first index of the
// largest score). log16's G is within 1e-6 of log(-log U) at every one of the 2^24 values of U; the
// slack (1e-3 plus 2^-16 of |best|) covers that and the rounding of the score. Returns the smallest k
// that may still win (0: every draw may).
static inline int32_t first_contender(float largest_scaled_logit, float best) {
  const double gap = static_cast<double>(largest_scaled_logit) - best + 1e-3 + std::fabs(best) * 0x1p-16;
  if (!(gap < 4.0)) return 0;  // NaN, or u < e^-54: no draw can be ruled out
  const double u = std::exp(-std::exp(gap));
  // (k + 0.5) / 2^24 < u for every k below the result, whatever the float rounding of k + 0.5
  return std::max<int32_t>(0, static_cast<int32_t>(std::floor(u * 0x1p24 - 0.5)) - 1);
}

// The largest logit of n (a multiple of 16), NaN ignored.
template <typename T>
static inline float largest_logit(const T* logits, int64_t n) {
  __m512 largest = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) largest = _mm512_max_ps(load16(logits + i), largest);  // NaN loses
  return _mm512_reduce_max_ps(largest);
}

// The best score and its first index in each of 16 lanes (lane j: indices j mod 16).
struct RaceLanes {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __m512i index = _mm512_setzero_si512();
  float overall = -INFINITY;  // the largest of `best`
  // Scores of indices i .. i + 15; returns whether the overall best rose.
  bool update(__m512 score, int64_t i) {
    const __mmask16 better = _mm512_cmp_ps_mask(score, best, _CMP_GT_OQ);
    if (better == 0) return false;
    const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(i)),
                                        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    best = _mm512_mask_mov_ps(best, better, score);
    index = _mm512_mask_mov_epi32(index, better, at);
    const float previous = overall;
    overall = _mm512_reduce_max_ps(best);
    return overall > previous;
  }
  // The best over all lanes, ties to the lowest index.
  void merge(float& best_score, int64_t& best_index) const {
    float lanes[16];
    int32_t indices[16];
    _mm512_storeu_ps(lanes, best);
    _mm512_storeu_si512(indices, index);
    for (int l = 0; l < 16; ++l)
      if (lanes[l] > best_score || (lanes[l] == best_score && indices[l] < best_index))
        best_score = lanes[l], best_index = indices[l];
  }
};

static constexpr int64_t kRaceRun = 4096;  // logits per run of first_contender: a few exps per 4096 draws
#endif

// The race on logits, in log space: argmax_i p_i / E_i = argmax_i (l_i / T - log E_i) when p = softmax(l / T),
// so no softmax, no normalisation and no fp32 copy of bf16 logits is needed; -inf logits (filtered) never win.
// Vectors of 16 draws that first_contender rules out skip their two logarithms (most of them, once the
// first few hundred draws have set a best score); the winner is the one the full race picks.
template <typename T>
static int64_t race_one_logits(const T* logits, int64_t V, float inv_temperature, uint64_t key, uint64_t c0) {
  float best = -INFINITY;
  int64_t best_index = 0, i = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
  const __m512 scale = _mm512_set1_ps(inv_temperature);
  const int64_t whole = V / 16 * 16;
  RaceLanes lanes;
  for (int64_t run = 0; run < whole; run += kRaceRun) {
    const int64_t run_end = std::min(whole, run + kRaceRun);
    // l / T rounds monotonically for 1 / T > 0, so this is the largest scaled logit of the run
    const float largest = inv_temperature > 0.f ? largest_logit(logits + run, run_end - run) * inv_temperature
                                                : INFINITY;
    __m512i first = _mm512_set1_epi32(first_contender(largest, lanes.overall));
    for (i = run; i < run_end; i += 16) {
      const __m512i k = draws16(key, c0 + i);
      if (_mm512_cmp_epi32_mask(k, first, _MM_CMPINT_NLT) == 0) continue;  // no draw can win
      const __m512 score = _mm512_sub_ps(_mm512_mul_ps(load16(logits + i), scale), race_noise16(k));
      if (lanes.update(score, i)) first = _mm512_set1_epi32(first_contender(largest, lanes.overall));
    }
  }
  i = whole;
  lanes.merge(best, best_index);
#endif
  for (; i < V; ++i) {
    const float exponential = -std::log(uniform_of(splitmix64(key + (c0 + i) * kGolden)));
    const float score = static_cast<float>(logits[i]) * inv_temperature - std::log(exponential);
    if (score > best) best = score, best_index = i;
  }
  return best_index;
}

// ---- transposition ------------------------------------------------------------------------------------
// src [R, C] -> its transpose [C, R], both contiguous, elements moved as bits (bf16, fp16: 2 bytes; fp32: 4).
// The "transposed" linear path (model/transformer.py Linear) computes W x^T as [out, rows] and needs it as
// [rows, out]: torch's strided copy does a [151,936, 32] bf16 head output in ~3 ms and a [151,936, 64] one in
// ~12 ms (docs/BENCHMARKS.md, "Real-size models"). A tile is TILE_ROWS source rows x up to TILE_COLS columns,
// 16 KB of bf16 (32 KB of fp32): it stays in the L1 cache while each of its columns is read out (a 64 KB tile
// did not, and a [151,936, 64] source took 10 ms instead of ~2), and each destination row gets a 512-byte run.
template <typename E>
static void transpose_tiles(const E* src, E* dst, int64_t R, int64_t C) {
  constexpr int64_t TILE_ROWS = 256, TILE_COLS = 32;
  const int64_t row_tiles = (R + TILE_ROWS - 1) / TILE_ROWS, col_tiles = (C + TILE_COLS - 1) / TILE_COLS;
  at::parallel_for(0, row_tiles * col_tiles, std::max<int64_t>(1, task_elements() / (TILE_ROWS * TILE_COLS)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t tile = begin; tile < end; ++tile) {
      const int64_t r0 = (tile / col_tiles) * TILE_ROWS, c0 = (tile % col_tiles) * TILE_COLS;
      const int64_t r1 = std::min(r0 + TILE_ROWS, R), c1 = std::min(c0 + TILE_COLS, C);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * R + r] = src[r * C + c];  // dst row c, contiguous in r
    }
  });
}

torch::Tensor transpose_matrix(torch::Tensor src) {
  TORCH_CHECK(src.dim() == 2 && src.is_contiguous() && src.device().is_cpu(),
              "transpose_matrix: a contiguous CPU matrix expected");
  auto dst = torch::empty({src.size(1), src.size(0)}, src.options());
  const int64_t R = src.size(0), C = src.size(1);
  if (src.element_size() == 2) {
    transpose_tiles(static_cast<const uint16_t*>(src.data_ptr()), static_cast<uint16_t*>(dst.data_ptr()), R, C);
  } else if (src.element_size() == 4) {
    transpose_tiles(static_cast<const uint32_t*>(src.data_ptr()), static_cast<uint32_t*>(dst.data_ptr()), R, C);
  } else {
    TORCH_CHECK(false, "transpose_matrix: 2- or 4-byte elements expected");
  }
  return dst;
}

torch::Tensor race_sample_logits(torch::Tensor logits, torch::Tensor inv_temperatures, torch::Tensor keys,
                                 int64_t num_draws) {
  // logits [S, V] fp32 / bf16 (filtered tokens -inf); inv_temperatures [S] fp32; keys [S] int64
  // -> tokens [S, num_draws] int64: draw d of row r is the race over counters d * V + i with key keys[r]
  TORCH_CHECK(logits.is_contiguous() && inv_temperatures.scalar_type() == at::kFloat, "race_sample_logits: inputs");
  keys = keys.contiguous();
  inv_temperatures = inv_temperatures.contiguous();
  const int64_t rows = logits.size(0), V = logits.size(1);
  auto tokens = torch::empty({rows, num_draws}, keys.options());
  const int64_t* kp = keys.data_ptr<int64_t>();
  const float* tp_inv = inv_temperatures.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "race_sample_logits", [&] {
    const scalar_t* lp = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows * num_draws, 4, [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t r = task / num_draws, draw = task % num_draws;
        tp[task] = race_one_logits(lp + r * V, V, tp_inv[r], static_cast<uint64_t>(kp[r]),
                                   static_cast<uint64_t>(draw * V));
      }
    });
  });
  return tokens;
}


// ---- bf16 linear: out = x @ W^T (+ bias), fp32 accumulation (vdpbf16ps) ----
// W [N, K] is packed once into column blocks of LINEAR_COLUMNS: packed[block][k / 2][column][k % 2], so one
// 64-byte load holds the (k, k+1) pair of 16 columns (the operand layout of vdpbf16ps). A row tile of up
// to 8 rows x 48 columns keeps its 24 accumulators in registers over a K chunk; every output element sums
// its K products in the same order whatever the number of rows, so a row's result does not depend on the
// batch it is in. The block's weights come from DRAM once per call (a decode step reads every weight once):
// tile 0 streams them, and tiles 1.. prefetch the next chunk, so memory and arithmetic overlap
// (docs/BENCHMARKS.md, "Real-size models").
#if defined(__AVX512BF16__)
constexpr int64_t LINEAR_COLUMNS = 48;       // 3 zmm of 16 fp32 accumulators per row
constexpr int64_t LINEAR_ROWS = 8;           // rows per register tile: 8 x 3 = 24 accumulators
constexpr int64_t LINEAR_CHUNK_PAIRS = 1024; // K pairs per chunk: a 48-column chunk is <= 192 KiB (L2)
constexpr int64_t LINEAR_GROUP_ROWS = 128;   // rows per pass over the weights: their x rows stay in L2

bool has_bf16_linear() { return true; }

torch::Tensor pack_bf16_linear(torch::Tensor weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == torch::kBFloat16 && weight.size(1) % 2 == 0,
              "pack_bf16_linear: a [N, K] bf16 weight with an even K");
  const int64_t N = weight.size(0), pairs = weight.size(1) / 2;
  const int64_t blocks = (N + LINEAR_COLUMNS - 1) / LINEAR_COLUMNS;
  auto packed = torch::zeros({blocks, pairs, LINEAR_COLUMNS, 2}, weight.options());
  auto plain = weight.contiguous();
  const uint32_t* src = reinterpret_cast<const uint32_t*>(plain.data_ptr());  // one (k, k+1) pair per word
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr());
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {  // writes in order; the block's 48 rows are read side by side
      const int64_t columns = std::min(LINEAR_COLUMNS, N - b * LINEAR_COLUMNS);
      for (int64_t kp = 0; kp < pairs; ++kp)
        for (int64_t c = 0; c < columns; ++c)
          dst[(b * pairs + kp) * LINEAR_COLUMNS + c] = src[(b * LINEAR_COLUMNS + c) * pairs + kp];
    }
  });
  return packed;
}

// The next chunk's bytes [begin, begin + lines * 64), handed out `lines` per `steps` K pairs.
struct Prefetch {
  const char* begin = nullptr;
  int64_t lines = 0, steps = 1;
};

// Where a tile's finished rows go: rounded to bf16 after the fp32 bias, `columns` of them, rows N apart.
struct LinearOutput {
  c10::BFloat16* out;
  int64_t N, columns;
  const float* bias;  // nullptr without a bias
};

static inline void store_linear_row(const __m512* acc, const LinearOutput& o, c10::BFloat16* row) {
  for (int64_t j = 0; j * 16 < o.columns; ++j) {
    const int64_t n = o.columns - 16 * j;
    const __m512 v = o.bias == nullptr ? acc[j] : _mm512_add_ps(acc[j], _mm512_maskz_loadu_ps(first_lanes(n), o.bias + 16 * j));
    store_n(row + 16 * j, v, n);
  }
}

// acc[R rows x 48] (+)= x rows [R, this chunk's pairs] . chunk: the accumulators start at 0 on the first
// chunk and are kept in `partial` between chunks; after the last one the rows go to `output`.
template <int R>
static void linear_tile(const uint32_t* x, int64_t x_pairs, const __m512bh* chunk, int64_t pairs, float* partial,
                        bool first, bool last, const LinearOutput& output, int64_t row0, Prefetch prefetch) {
  __m512 acc[R][3];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < 3; ++j) acc[r][j] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + (r * 3 + j) * 16);
  int64_t line = 0, credit = 0;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const __m512bh w0 = chunk[3 * kp], w1 = chunk[3 * kp + 1], w2 = chunk[3 * kp + 2];
    for (credit += prefetch.lines; credit >= prefetch.steps; credit -= prefetch.steps)
      _mm_prefetch(prefetch.begin + 64 * line++, _MM_HINT_T1);  // to L2: tiles read a chunk from there
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512bh xr = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * x_pairs + kp]));  // (x_k, x_k+1)
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);  // += x_k w_k + x_k+1 w_k+1, 16 columns each
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], xr, w2);
    }
  }
  for (int r = 0; r < R; ++r) {
    if (last) {
      store_linear_row(acc[r], output, output.out + (row0 + r) * output.N);
    } else {
      for (int j = 0; j < 3; ++j) _mm512_store_ps(partial + (r * 3 + j) * 16, acc[r][j]);
    }
  }
}

using LinearTile = void (*)(const uint32_t*, int64_t, const __m512bh*, int64_t, float*, bool, bool,
                            const LinearOutput&, int64_t, Prefetch);
static constexpr LinearTile linear_tiles[LINEAR_ROWS + 1] = {
    nullptr, linear_tile<1>, linear_tile<2>, linear_tile<3>, linear_tile<4>,
    linear_tile<5>, linear_tile<6>, linear_tile<7>, linear_tile<8>};

// One column block over all rows: K chunk by chunk; within a chunk, row tile by row tile. Tiles after the
// first prefetch the block's next chunk (or the next block's first) while they compute from cache.
static void linear_block(const uint32_t* x, int64_t M, int64_t pairs, const char* block, const char* next,
                         float* partial, const LinearOutput& output) {
  const int64_t tiles = (M + LINEAR_ROWS - 1) / LINEAR_ROWS;
  const int64_t chunks = (pairs + LINEAR_CHUNK_PAIRS - 1) / LINEAR_CHUNK_PAIRS;
  const int64_t pair_bytes = LINEAR_COLUMNS * 4;
  const int64_t helpers = std::max<int64_t>(1, tiles - 1);  // tiles that prefetch
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t kp0 = pairs * c / chunks, kp1 = pairs * (c + 1) / chunks;
    const char* following = c + 1 < chunks ? block + kp1 * pair_bytes : next;
    const int64_t following_lines = following == nullptr ? 0 : pair_bytes * (kp1 - kp0) / 64;
    for (int64_t t = 0; t < tiles; ++t) {
      Prefetch prefetch;
      if (following != nullptr && (t > 0 || tiles == 1)) {
        const int64_t h = tiles == 1 ? 0 : t - 1, l0 = following_lines * h / helpers;
        prefetch = {following + 64 * l0, following_lines * (h + 1) / helpers - l0, kp1 - kp0};
      }
      linear_tiles[std::min(LINEAR_ROWS, M - t * LINEAR_ROWS)](
          x + t * LINEAR_ROWS * pairs + kp0, pairs, reinterpret_cast<const __m512bh*>(block + kp0 * pair_bytes),
          kp1 - kp0, partial + t * LINEAR_ROWS * LINEAR_COLUMNS, c == 0, c + 1 == chunks, output,
          t * LINEAR_ROWS, prefetch);
    }
  }
}

// Column blocks per parallel task: a task multiplies at least 64 x task_elements() pairs (~4-16 us), so
// that a small model's small calls run on the calling thread instead of waking the others.
static int64_t linear_blocks_per_task(int64_t rows, int64_t pairs) {
  return std::max<int64_t>(1, 64 * task_elements() / std::max<int64_t>(1, rows * pairs * LINEAR_COLUMNS));
}

torch::Tensor bf16_linear(torch::Tensor x, torch::Tensor packed, int64_t out_features, c10::optional<torch::Tensor> bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kBFloat16 && packed.dim() == 4 &&
              packed.size(1) * 2 == x.size(1) && packed.size(0) * LINEAR_COLUMNS >= out_features,
              "bf16_linear: x [M, K] bf16 and a weight packed by pack_bf16_linear for this K");
  auto input = x.contiguous();
  const int64_t M = input.size(0), pairs = packed.size(1), blocks = packed.size(0), N = out_features;
  auto out = torch::empty({M, N}, input.options());
  if (M == 0) return out;
  torch::Tensor bias32 = bias.has_value() ? bias->to(torch::kFloat32).contiguous() : torch::Tensor();
  const float* b32 = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(input.data_ptr());
  const char* wp = reinterpret_cast<const char*>(packed.data_ptr());
  const int64_t block_bytes = pairs * LINEAR_COLUMNS * 4;
  auto* op = reinterpret_cast<c10::BFloat16*>(out.data_ptr());
  at::parallel_for(0, blocks, linear_blocks_per_task(M, pairs), [&](int64_t begin, int64_t end) {
    // fp32 partial sums of one row group's tiles between K chunks (read only when K > 2 * LINEAR_CHUNK_PAIRS)
    thread_local std::vector<float> buffer(LINEAR_GROUP_ROWS * LINEAR_COLUMNS + 16);
    float* partial = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
    for (int64_t g0 = 0; g0 < M; g0 += LINEAR_GROUP_ROWS) {  // row groups: see LINEAR_GROUP_ROWS
      const int64_t rows = std::min(LINEAR_GROUP_ROWS, M - g0);
      for (int64_t b = begin; b < end; ++b) {
        const char* next = b + 1 < end ? wp + (b + 1) * block_bytes : nullptr;
        const LinearOutput output{op + g0 * N + b * LINEAR_COLUMNS, N, std::min(LINEAR_COLUMNS, N - b * LINEAR_COLUMNS),
                                  b32 == nullptr ? nullptr : b32 + b * LINEAR_COLUMNS};
        linear_block(xp + g0 * pairs, rows, pairs, wp + b * block_bytes, next, partial, output);
      }
    }
  });
  return out;
}
#else
bool has_bf16_linear() { return false; }
torch::Tensor pack_bf16_linear(torch::Tensor) {
  TORCH_CHECK(false, "pack_bf16_linear needs an AVX512-BF16 build");
  return {};
}
torch::Tensor bf16_linear(torch::Tensor, torch::Tensor, int64_t, c10::optional<torch::Tensor>) {
  TORCH_CHECK(false, "bf16_linear needs an AVX512-BF16 build");
  return {};
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (CPU)");
  m.def("paged_prefill", &paged_prefill, "paged causal prefill attention (CPU, AVX-512)");
  m.def("has_prefill_kernel", &has_prefill_kernel, "whether paged_prefill has a kernel for this head_dim");
  m.def("add_rms_norm", &add_rms_norm, "residual add + RMSNorm (CPU)");
  m.def("rope_write_kv", &rope_write_kv, "RoPE on q and k + KV cache write (CPU)");
  m.def("silu_mul", &silu_mul, "silu(gate) * up (CPU)");
  m.def("has_bf16_linear", &has_bf16_linear, "whether bf16_linear is built (AVX512-BF16)");
  m.def("pack_bf16_linear", &pack_bf16_linear, "a [N, K] bf16 weight in bf16_linear's layout");
  m.def("bf16_linear", &bf16_linear, "x [M, K] @ W^T (+ bias) on a packed bf16 weight (CPU, AVX512-BF16)");
  m.def("transpose_matrix", &transpose_matrix, "src [R, C] -> its transpose [C, R], contiguous (CPU)");
  m.def("race_sample_logits", &race_sample_logits, "the same race on logits / T in log space (CPU)");
}
