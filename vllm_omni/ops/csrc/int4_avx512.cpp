// cpu_int4's AVX-512 kernel set (AVX512F/BW/VL/DQ + AVX512_VNNI + AVX512_VBMI), torch.ops
// namespace vllm_omni_avx512. The layout, the arithmetic every set shares and the ops are in
// int4_base.h and int4_ops.h.
//
// The GEMV. Why not torch's _weight_int4pack_mm_for_cpu: it applies scale and zero to every
// weight and streamed a 0.5B model's int4 weights at about 12.5 GB/s on two cores of an AVX-512
// machine. Here the sum over a group is taken on the codes alone, and scale and zero are applied
// once per group. vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them into an
// int32 lane: 64 multiply-adds per instruction, and the codes q = 0..15 are already unsigned
// bytes; x enters as the two signed bytes hi, lo of its fixed point. vpermt2b gathers, from 4 k
// (two 64-byte loads), dword n = the bytes of k..k+3 that hold rows n and n + 32: its low
// nibbles are row n's codes, its high ones row n + 32's. Two permutes cover the block's 64 rows
// in row order. The weights are prefetched 4 KiB ahead into L2 (or non-temporally: measured side
// by side in one process it was slower, 8-10 % on the weight stream and ~5 % a decode step).
// An fp32 loop (codes through a vpermps table, fp32 FMAs) was 8-20 % slower on the weight
// stream and gave other bits than the other sets; it was removed.
// One row of x (a decode step at batch 1) reads up to 4 adjacent blocks side by side
// (kStreamBlocks, block_vnni's B: 8 accumulators a block), so as many weight streams, K * 32
// bytes apart, are in flight for the prefetchers instead of one. Same bits: each output's sums
// run in the same order. On an Intel AMX Xeon, where one stream held the GEMV at ~80 % of the
// DRAM probe, 4 streams read a 3B decode step's weights 10-13 % faster than 1 and 6-9 % faster
// than 2, and a compiled 3B decode step took 67.5 ms with 4 instead of 74.0 with 1 (72.1 with 2
// instead of 75.6 in another run; results/int4_kernels/20261207T0736Z-two-streams/). On an AMD
// EPYC Zen 5 (the avx512bf16 set) it is the other way round: 4 blocks of W4A16 take 32 int32
// accumulators (sum q * hi and q * lo, 8 a block), all the registers there are, so the inner
// loop spills, and there two cores read the weights faster than the spilling loop multiplies
// them: a compiled 3B decode step took 34.9 ms with 1 and 43.5 with 4
// (results/int4_kernels/20261208T0231Z-zen5-one-stream/). So kGemvStreams, the default, is 1 in
// the avx512bf16 set (AMD Zen 4/5) and 4 in the others.

#include <immintrin.h>
#ifdef OMNI_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "int4_base.h"

namespace omni {
namespace isa {

#ifdef OMNI_AMX
constexpr const char* kName = "amx";
#elif defined(OMNI_AVX512BF16)
constexpr const char* kName = "avx512bf16";
#else
constexpr const char* kName = "avx512";
#endif
constexpr int kRows = 2;  // 8 accumulators per row of x: two rows fill the registers
constexpr int kStreamBlocks = 4;  // one row of x: up to 4 blocks at once (block_vnni)
#ifdef OMNI_AVX512BF16
constexpr int kGemvStreams = 1;  // the default (set_gemv_streams): see above
#else
constexpr int kGemvStreams = 4;
#endif

// Round to nearest even, as torch's float -> bfloat16 conversion does (no NaN reaches here:
// the inputs are finite bf16 and finite codes).
// bf16_rounded: the fp32 bits with the bf16 in their high half (the low half is left over).
inline __m512i bf16_rounded(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
}
inline __m256i fp32x16_to_bf16(__m512 v) {
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_rounded(v), 16));
}

// 16 bf16 at p as fp32 (exact: bf16 is the top half of an fp32).
inline __m512 bf16x16_to_fp32(const at::BFloat16* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// q - 8 for q = 0..15, as floats: the table vpermps looks codes up in.
inline __m512 code_table() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// 16 (scale, zero) bf16 pairs starting at p, as two fp32 vectors.
inline void load_scale_zero(const at::BFloat16* p, __m512* scale, __m512* zero) {
  __m512i pair = _mm512_loadu_si512(p);
  *scale = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
  *zero = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(0xFFFF0000)));
}

// vpermt2b index over the 128 bytes of k..k+3: dword n takes byte (first + n) of each k.
struct QuadIndex {
  alignas(64) uint8_t bytes[64];
};
constexpr QuadIndex quad_index(int first) {
  QuadIndex q{};
  for (int n = 0; n < 16; ++n)
    for (int j = 0; j < 4; ++j) q.bytes[4 * n + j] = static_cast<uint8_t>(32 * j + first + n);
  return q;
}
constexpr QuadIndex kRowsLo = quad_index(0), kRowsHi = quad_index(16);

// fixed_point_scalar<A8>'s bits.
template <bool A8>
void fixed_point(const at::BFloat16* x, int64_t K, int64_t gs, int8_t* hi, int8_t* lo,
                 float* step, int32_t* csum, float* xsum) {
  constexpr int kMax = A8 ? kInt8Max : kFixedMax;
  constexpr float kSteps = A8 ? kInt8Steps : static_cast<float>(kFixedMax);
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t g = 0; g < K / gs; ++g) {
    __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      const __m512 v = bf16x16_to_fp32(x + k);
      amax = _mm512_max_ps(amax, _mm512_and_ps(v, sign));
      sum = _mm512_add_ps(sum, v);
    }
    const float top = _mm512_reduce_max_ps(amax);
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, sum);
    xsum[g] = reduce16(lanes);  // the order written out, whatever the compiler's reduce does
    step[g] = top / kSteps;
    const __m512 inv = _mm512_set1_ps(top > 0 ? kMax / top : 0.0f);
    const __m512i bound = _mm512_set1_epi32(kMax), nbound = _mm512_set1_epi32(-kMax);
    __m512i codes = _mm512_setzero_si512();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(bf16x16_to_fp32(x + k), inv));
      c = _mm512_max_epi32(_mm512_min_epi32(c, bound), nbound);
      codes = _mm512_add_epi32(codes, c);
      const __m512i h = A8 ? c : _mm512_srai_epi32(c, 7);
      const __m512i l = A8 ? _mm512_setzero_si512() : _mm512_and_si512(c, _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + k), _mm512_cvtepi32_epi8(h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + k), _mm512_cvtepi32_epi8(l));
    }
    const int32_t total = _mm512_reduce_add_epi32(codes);
    csum[g] = A8 ? 128 * total : total;
  }
}

// A8: x is W4A8's int8 codes (lo = 0), so one vpdpbusd a register of codes, not two, and
// dot = 128 * sum q * c - 8 * csum (csum already 128 * sum c). B: blocks read side by side, the
// j-th at w + j * K * 32 (its outputs at n0 + 64 j); B > 1 only with M = 1.
template <int M, int Hint, bool A8 = false, int B = 1>
void block_vnni(const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0, int64_t K,
                int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out, int64_t ldo) {
  const __m512i index_lo = _mm512_load_si512(kRowsLo.bytes);
  const __m512i index_hi = _mm512_load_si512(kRowsHi.bytes);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const int64_t G = K / gs, stride = K * 32;
  __m512 o[B][M][4];
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < 4; ++i) o[j][m][i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    __m512i ah[B][M][4], al[B][M][4];  // sum q * hi and sum q * lo, rows 16i .. 16i + 15
    for (int j = 0; j < B; ++j)
      for (int m = 0; m < M; ++m)
        for (int i = 0; i < 4; ++i) ah[j][m][i] = al[j][m][i] = _mm512_setzero_si512();
    (void)al;
    const uint8_t* p = w + g * gs * 32;
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 4, p += 128) {
      for (int j = 0; j < B; ++j) {
        const uint8_t* pj = p + j * stride;
        _mm_prefetch(reinterpret_cast<const char*>(pj) + 4096, static_cast<_mm_hint>(Hint));
        _mm_prefetch(reinterpret_cast<const char*>(pj) + 4096 + 64, static_cast<_mm_hint>(Hint));
        const __m512i a = _mm512_loadu_si512(pj), b = _mm512_loadu_si512(pj + 64);
        const __m512i rows_lo = _mm512_permutex2var_epi8(a, index_lo, b);  // rows 0..15 | 32..47
        const __m512i rows_hi = _mm512_permutex2var_epi8(a, index_hi, b);  // 16..31 | 48..63
        const __m512i q[4] = {_mm512_and_si512(rows_lo, nibble), _mm512_and_si512(rows_hi, nibble),
                              _mm512_and_si512(_mm512_srli_epi16(rows_lo, 4), nibble),
                              _mm512_and_si512(_mm512_srli_epi16(rows_hi, 4), nibble)};
        for (int m = 0; m < M; ++m) {
          int32_t h, l;
          std::memcpy(&h, fx.hi.data() + (m0 + m) * K + k, sizeof(h));
          const __m512i xh = _mm512_set1_epi32(h);
          for (int i = 0; i < 4; ++i) ah[j][m][i] = _mm512_dpbusd_epi32(ah[j][m][i], q[i], xh);
          if constexpr (!A8) {
            std::memcpy(&l, fx.lo.data() + (m0 + m) * K + k, sizeof(l));
            const __m512i xl = _mm512_set1_epi32(l);
            for (int i = 0; i < 4; ++i) al[j][m][i] = _mm512_dpbusd_epi32(al[j][m][i], q[i], xl);
          }
        }
      }
    }
    // sum (q - 8) * c = 128 * sum q * hi + sum q * lo - 8 * sum c, then scale and zero.
    for (int j = 0; j < B; ++j) {
      const at::BFloat16* s = sz + (g * n_total + n0 + 64 * j) * 2;
      for (int i = 0; i < 4; ++i) {
        __m512 scale, zero;
        load_scale_zero(s + i * 32, &scale, &zero);
        for (int m = 0; m < M; ++m) {
          const int64_t mg = (m0 + m) * G + g;
          const __m512i sum = A8 ? _mm512_slli_epi32(ah[j][m][i], 7)
                                 : _mm512_add_epi32(_mm512_slli_epi32(ah[j][m][i], 7), al[j][m][i]);
          const __m512i dot = _mm512_sub_epi32(sum, _mm512_set1_epi32(8 * fx.csum[mg]));
          o[j][m][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                       _mm512_mul_ps(scale, _mm512_set1_ps(fx.step[mg])), o[j][m][i]);
          o[j][m][i] = _mm512_fmadd_ps(zero, _mm512_set1_ps(fx.xsum[mg]), o[j][m][i]);
        }
      }
    }
  }
  for (int j = 0; j < B; ++j)
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < 4; ++i)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (m0 + m) * ldo + n0 + 64 * j + 16 * i),
                            fp32x16_to_bf16(o[j][m][i]));
}

// rows 1 or 2: that many rows of x on one block; -B: one row on B adjacent blocks.
static_assert(kStreamBlocks <= 4, "block_rows dispatches -2 .. -4 only; any other rows is one");
template <int Hint, bool A8>
void block_rows(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
                int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
                int64_t ldo) {
  constexpr int kHint = Hint ? _MM_HINT_NTA : _MM_HINT_T1;
  if (rows == 2)
    block_vnni<2, kHint, A8>(w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
  else if (rows == -2)
    block_vnni<1, kHint, A8, 2>(w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
  else if (rows == -3)
    block_vnni<1, kHint, A8, 3>(w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
  else if (rows == -4)
    block_vnni<1, kHint, A8, 4>(w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
  else
    block_vnni<1, kHint, A8>(w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
}

template <int Hint>
void block64(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
             int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
             int64_t ldo) {
  block_rows<Hint, false>(rows, w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
}

#define OMNI_A8_KERNELS 1

template <int Hint>
void block64_a8(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
                int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
                int64_t ldo) {
  block_rows<Hint, true>(rows, w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
}

// One group of W^T for a full block: gs rows of 64 contiguous bf16, `ld` apart. p: the group's
// first byte; sz: the block's first (scale, zero) pair of the group.
// One k of a full block (p: its 32 bytes) as fp32 weights, v[j] = rows 16 j .. 16 j + 15:
// fma(q - 8, scale, zero) with the group's scale[j], zero[j] (load_scale_zero's).
__attribute__((always_inline)) inline void dequant_k(const uint8_t* p, __m512 lut,
                                                     const __m512 (&scale)[4],
                                                     const __m512 (&zero)[4], __m512 (&v)[4]) {
  const __m512i d0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i d1 =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
  const __m512 q[4] = {_mm512_permutexvar_ps(d0, lut), _mm512_permutexvar_ps(d1, lut),
                       _mm512_permutexvar_ps(_mm512_srli_epi32(d0, 4), lut),
                       _mm512_permutexvar_ps(_mm512_srli_epi32(d1, 4), lut)};
  for (int j = 0; j < 4; ++j) v[j] = _mm512_fmadd_ps(q[j], scale[j], zero[j]);
}

void dequant64(const uint8_t* p, const at::BFloat16* sz, int64_t gs, at::BFloat16* out,
               int64_t ld) {
  const __m512 lut = code_table();
  __m512 scale[4], zero[4], v[4];
  for (int j = 0; j < 4; ++j) load_scale_zero(sz + 32 * j, &scale[j], &zero[j]);
  for (int64_t k = 0; k < gs; ++k, p += 32, out += ld) {
    dequant_k(p, lut, scale, zero, v);
    for (int j = 0; j < 4; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * j), fp32x16_to_bf16(v[j]));
  }
}

// ---- The GEMM (int4_base.h): vpdpwssd multiplies 16 dwords of code pairs (q[2kp], q[2kp+1]) by
// one row's broadcast pair of fixed-point codes and adds both products into each int32 lane: 32
// multiply-adds per instruction, one instruction per row, 16 outputs and two k. A tile holds R
// rows x 64 outputs in 4R accumulators; the 4 registers of codes serve all R rows.

// The unpacking: vpermb puts, for 16 rows, byte j of k (low 16 bits of a dword) and byte j of
// k + 1 (high 16 bits) of the 64 bytes of k, k + 1; the low nibbles are rows j, the high ones
// rows j + 32.
struct PairIndex {
  alignas(64) uint8_t bytes[64];
};
constexpr PairIndex pair_index(int first) {
  PairIndex q{};
  for (int n = 0; n < 16; ++n) {
    q.bytes[4 * n] = static_cast<uint8_t>(first + n);
    q.bytes[4 * n + 1] = 0;
    q.bytes[4 * n + 2] = static_cast<uint8_t>(32 + first + n);
    q.bytes[4 * n + 3] = 0;
  }
  return q;
}
constexpr PairIndex kPairLo = pair_index(0), kPairHi = pair_index(16);

inline void unpack64(const uint8_t* p, int64_t gs, int32_t* qb) {
  const __m512i index_lo = _mm512_load_si512(kPairLo.bytes);
  const __m512i index_hi = _mm512_load_si512(kPairHi.bytes);
  const __m512i nibble = _mm512_set1_epi32(0x000F000F);
  for (int64_t kp = 0; kp < gs / 2; ++kp, p += 64, qb += kBlockN) {
    const __m512i v = _mm512_loadu_si512(p);
    const __m512i lo = _mm512_permutexvar_epi8(index_lo, v);  // rows 0..15 | 32..47
    const __m512i hi = _mm512_permutexvar_epi8(index_hi, v);  // rows 16..31 | 48..63
    _mm512_storeu_si512(qb, _mm512_and_si512(lo, nibble));
    _mm512_storeu_si512(qb + 16, _mm512_and_si512(hi, nibble));
    _mm512_storeu_si512(qb + 32, _mm512_and_si512(_mm512_srli_epi16(lo, 4), nibble));
    _mm512_storeu_si512(qb + 48, _mm512_and_si512(_mm512_srli_epi16(hi, 4), nibble));
  }
}

constexpr int kTileRows = 6;  // 24 accumulators + 4 registers of codes + the broadcast

// The float finishing of one group for row r of a tile, 64 outputs in 4 accumulators that
// started at -8 * csum (so they hold sum (q - 8) * c; W4A8's, Shift 7: that sum over 128).
// Inlined: a call would take the accumulators through memory.
template <int Shift = 0>
__attribute__((always_inline)) inline void finish_row(const GemmGroup& gg, const GemmRows& x,
                                                      int r, const __m512i (&acc)[4], float* o) {
  const __m512 step = _mm512_set1_ps(x.step[r * x.ldm]), xsum = _mm512_set1_ps(x.xsum[r * x.ldm]);
  for (int i = 0; i < 4; ++i) {
    float* y = o + r * kBlockN + 16 * i;
    const __m512i dot = Shift ? _mm512_slli_epi32(acc[i], Shift) : acc[i];
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                               _mm512_mul_ps(_mm512_load_ps(gg.sc + 16 * i), step),
                               _mm512_loadu_ps(y));
    v = _mm512_fmadd_ps(_mm512_load_ps(gg.ze + 16 * i), xsum, v);
    _mm512_storeu_ps(y, v);
  }
}

// R rows x 64 outputs. The accumulators are named variables, not an array: GCC keeps an array
// of 16 or more vectors in memory and stores every update (2.7x slower, measured).
template <int R>
void tile_vnni(const GemmGroup& gg, const GemmRows& x, float* o) {
  const int32_t* qb = gg.qb;
#define OMNI_ROW(r)                                                         \
  if constexpr (R > r) {                                                    \
    const __m512i c = _mm512_set1_epi32(c2[r]);                              \
    acc##r##0 = _mm512_dpwssd_epi32(acc##r##0, q0, c);                      \
    acc##r##1 = _mm512_dpwssd_epi32(acc##r##1, q1, c);                      \
    acc##r##2 = _mm512_dpwssd_epi32(acc##r##2, q2, c);                      \
    acc##r##3 = _mm512_dpwssd_epi32(acc##r##3, q3, c);                      \
  }
#define OMNI_ACC(r)                                                                       \
  __m512i acc##r##0 = _mm512_set1_epi32(R > r ? -8 * x.csum[r * x.ldm] : 0),              \
          acc##r##1 = acc##r##0, acc##r##2 = acc##r##0, acc##r##3 = acc##r##0;
  OMNI_ACC(0) OMNI_ACC(1) OMNI_ACC(2) OMNI_ACC(3) OMNI_ACC(4) OMNI_ACC(5)
  const int32_t* c2 = x.c2;  // row r's pair kp at c2[kp * kTileRows + r]
  for (int64_t kp = 0; kp < gg.kpairs; ++kp, qb += kBlockN, c2 += kTileRows) {
    const __m512i q0 = _mm512_loadu_si512(qb), q1 = _mm512_loadu_si512(qb + 16);
    const __m512i q2 = _mm512_loadu_si512(qb + 32), q3 = _mm512_loadu_si512(qb + 48);
    OMNI_ROW(0) OMNI_ROW(1) OMNI_ROW(2) OMNI_ROW(3) OMNI_ROW(4) OMNI_ROW(5)
  }
#define OMNI_FINISH(r) \
  if constexpr (R > r) finish_row(gg, x, r, {acc##r##0, acc##r##1, acc##r##2, acc##r##3}, o);
  OMNI_FINISH(0) OMNI_FINISH(1) OMNI_FINISH(2) OMNI_FINISH(3) OMNI_FINISH(4) OMNI_FINISH(5)
#undef OMNI_ACC
#undef OMNI_ROW
#undef OMNI_FINISH
}

// ---- W4A8's GEMM: vpdpbusd multiplies 16 dwords of 4 codes (q[4kq] .. q[4kq+3] of one output)
// by one row's broadcast 4 int8 codes of x: 64 multiply-adds an instruction, twice vpdpwssd's.
// The quads are what the GEMV's vpermt2b gives (rows 0..15, 16..31, 32..47, 48..63).
// ld_kq, ld_rows: dwords from one quad to the next and from rows 0..15 to rows 16..31 (the
// GEMM tiles' layout: 64, 16; the AMX tiles': 16, gs / 4 * 16, each 16 rows one tile).
inline void unpack64_quads(const uint8_t* p, int64_t gs, int32_t* qb, int64_t ld_kq = kBlockN,
                           int64_t ld_rows = 16) {
  const __m512i index_lo = _mm512_load_si512(kRowsLo.bytes);
  const __m512i index_hi = _mm512_load_si512(kRowsHi.bytes);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  for (int64_t kq = 0; kq < gs / 4; ++kq, p += 128, qb += ld_kq) {
    const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
    const __m512i rows_lo = _mm512_permutex2var_epi8(a, index_lo, b);  // rows 0..15 | 32..47
    const __m512i rows_hi = _mm512_permutex2var_epi8(a, index_hi, b);  // 16..31 | 48..63
    _mm512_storeu_si512(qb, _mm512_and_si512(rows_lo, nibble));
    _mm512_storeu_si512(qb + ld_rows, _mm512_and_si512(rows_hi, nibble));
    _mm512_storeu_si512(qb + 2 * ld_rows,
                        _mm512_and_si512(_mm512_srli_epi16(rows_lo, 4), nibble));
    _mm512_storeu_si512(qb + 3 * ld_rows,
                        _mm512_and_si512(_mm512_srli_epi16(rows_hi, 4), nibble));
  }
}

// R rows x 64 outputs, as tile_vnni: the accumulators start at -8 * sum c and end at
// sum (q - 8) * c, which times 128 is the 15-bit form's sum that finish_row takes.
template <int R>
void tile_quads(const GemmGroup& gg, const GemmRows& x, float* o) {
  const int32_t* qb = gg.qb;
#define OMNI_ROW(r)                                                         \
  if constexpr (R > r) {                                                    \
    const __m512i c = _mm512_set1_epi32(c4[r]);                              \
    acc##r##0 = _mm512_dpbusd_epi32(acc##r##0, q0, c);                      \
    acc##r##1 = _mm512_dpbusd_epi32(acc##r##1, q1, c);                      \
    acc##r##2 = _mm512_dpbusd_epi32(acc##r##2, q2, c);                      \
    acc##r##3 = _mm512_dpbusd_epi32(acc##r##3, q3, c);                      \
  }
#define OMNI_ACC(r)                                                                       \
  __m512i acc##r##0 = _mm512_set1_epi32(R > r ? -8 * (x.csum[r * x.ldm] / 128) : 0),      \
          acc##r##1 = acc##r##0, acc##r##2 = acc##r##0, acc##r##3 = acc##r##0;
  OMNI_ACC(0) OMNI_ACC(1) OMNI_ACC(2) OMNI_ACC(3) OMNI_ACC(4) OMNI_ACC(5)
  const int32_t* c4 = x.c2;  // row r's quad kq at c4[kq * kTileRows + r]
  for (int64_t kq = 0; kq < gg.kpairs; ++kq, qb += kBlockN, c4 += kTileRows) {
    const __m512i q0 = _mm512_loadu_si512(qb), q1 = _mm512_loadu_si512(qb + 16);
    const __m512i q2 = _mm512_loadu_si512(qb + 32), q3 = _mm512_loadu_si512(qb + 48);
    OMNI_ROW(0) OMNI_ROW(1) OMNI_ROW(2) OMNI_ROW(3) OMNI_ROW(4) OMNI_ROW(5)
  }
#define OMNI_FINISH(r) \
  if constexpr (R > r) finish_row<7>(gg, x, r, {acc##r##0, acc##r##1, acc##r##2, acc##r##3}, o);
  OMNI_FINISH(0) OMNI_FINISH(1) OMNI_FINISH(2) OMNI_FINISH(3) OMNI_FINISH(4) OMNI_FINISH(5)
#undef OMNI_ACC
#undef OMNI_ROW
#undef OMNI_FINISH
}

inline void tile8(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  switch (rows) {
    case 6: return tile_quads<6>(gg, x, o);
    case 5: return tile_quads<5>(gg, x, o);
    case 4: return tile_quads<4>(gg, x, o);
    case 3: return tile_quads<3>(gg, x, o);
    case 2: return tile_quads<2>(gg, x, o);
    default: return tile_quads<1>(gg, x, o);
  }
}

// 64 fp32 outputs of a tile to bf16, as the GEMV rounds them.
inline void store64(const float* o, at::BFloat16* out) {
  for (int i = 0; i < 4; ++i)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * i),
                        fp32x16_to_bf16(_mm512_loadu_ps(o + 16 * i)));
}

#ifdef OMNI_AMX
// ---- The amx set: this file built with -DOMNI_AMX -mamx-tile -mamx-int8 (int4_amx.cpp). Its
// GEMM runs on AMX tiles (Intel Sapphire Rapids and later); everything else is the avx512 set's.
// tdpbsud multiplies a tile of 16 rows of x's signed codes (16 x kc bytes) by one of the weight's
// unsigned codes in quads (kc/4 x 16 dwords, what unpack64_quads writes) into 16 x 16 int32:
// 16 x 16 x kc multiply-adds an instruction, 1,024 at kc = 64, 16 times vpdpbusd's. W4A8 takes
// one product a tile (x's int8 codes are hi); the 15-bit form two, hi and lo (0..127, so a signed
// byte too), added as 128 * hi + lo. The sums are exact integers and finish_row finishes them, so
// the bits are the other sets'.

// Linux gives a process AMX's tile data only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, Linux 5.16 and later). Refused: the GEMM takes the avx512 tiles.
inline bool amx_ready() {
  static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return ok;
}

// The tile configuration (palette 1): tiles 0-3 the int32 sums (16 rows x 16 outputs), 4-5 x's
// codes (16 rows x kc), 6-7 the weight's quads (kc / 4 x 16 outputs). Loaded by inline assembly:
// GCC 12's _tile_loadconfig reads the configuration as 8 bytes, so the compiler drops the stores
// that fill the rest (omni_ray/peers/llamacpp.py's _AMX_TILECFG_FIX: ggml's crash from it).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// kc: k per tile product, the largest of 64, 32, 16 that divides the group.
inline int amx_chunk(int64_t gs) { return gs % 64 == 0 ? 64 : gs % 32 == 0 ? 32 : 16; }

// Configures this thread's tiles for chunks of kc; amx_release() frees them.
inline void amx_configure(int kc) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(t < 6 ? 16 : kc / 4);
    cfg.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? kc : 64);
  }
  asm volatile("ldtilecfg %0" ::"m"(cfg));
}
inline void amx_release() { _tile_release(); }

constexpr int kAmxRows = 16;

// x's codes (hi or lo, rows [M][K]) as AMX tiles: for each 16 rows and chunk of kc, the 16 x kc
// bytes one after the other (a tile load reads 1 KiB in a row, not 16 rows K apart). xt: from
// row m0's tile on; rows past M stay as they are (zeros).
inline void amx_tiles_of_x(const int8_t* x, int64_t M, int64_t K, int kc, int8_t* xt) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < K / kc; ++c)
      std::memcpy(xt + m / kAmxRows * kAmxRows * K + c * kAmxRows * kc + m % kAmxRows * kc,
                  x + m * K + c * kc, kc);
}

// A GEMM of one full block on AMX, for all M rows of x: every group of the block is unpacked
// once (quads, each 16 outputs' a tile of their own), then 64 rows of x at a time run through
// the groups in order. A unit is one group's products for 32 outputs in four int32 tiles, 2 x 2:
// W4A8 two tiles of 16 rows by two of outputs, the 15-bit form hi and lo of 16 rows by two of
// outputs, so that each tile load serves two products; a group's units take the pass's rows
// one after the other, so its quads are read from L1 after the first (a tile load from L2
// costs about two products' time: 17-20 ns a product with its operands in L2, 6 in L1, on the
// Xeon of results/int4_amx/). The unit's sums go to memory, the next unit starts on the tile
// unit, and the vector unit finishes the sums (finish_row's arithmetic); two buffers of sums
// alternate. The code sum's -8 * sum c enters as the starting value of the tiles that hold it.
// Measured on one core (2048 x 11008, 512 rows): 64 rows a pass as fast as 32 or 128, and
// prefetching the next group's x into L1 made no difference.
constexpr int kAmxPassRows = 64;  // rows of x a pass over the block's groups

struct AmxScratch {
  std::vector<int32_t> qb;    // every group's quads: group g at g * gs / 4 * 64
  std::vector<float> sc, ze;  // [G][64]
  alignas(64) float y[kAmxPassRows * kBlockN];
  alignas(64) int32_t sums[2][4 * kAmxRows * 16];  // a unit's four tiles, two units apart
  alignas(64) int32_t base[kAmxPassRows * 16];      // starting values, row by row
};

// GCC's tile intrinsics paste the tile's number into the instruction: literal numbers only.
// q: the unit's first 16 outputs' quads of the group (the next 16 at q + fb_next); x0, x1: W4A8:
// two row tiles' codes, the 15-bit form: hi and lo of one row tile, each chunk after chunk.
template <bool A8>
__attribute__((always_inline)) inline void amx_issue(const int32_t* q, int64_t fb_next,
                                                     const int8_t* x0, const int8_t* x1,
                                                     int64_t chunks, int kc,
                                                     const int32_t* base0, const int32_t* base1) {
  if constexpr (A8) {  // tiles 0, 1: rows 0..15 x outputs 0..15, 16..31; tiles 2, 3: rows 16..31
    _tile_loadd(0, base0, 64);
    _tile_loadd(1, base0, 64);
    _tile_loadd(2, base1, 64);
    _tile_loadd(3, base1, 64);
  } else {  // tiles 0, 1: hi x outputs 0..15, 16..31; tiles 2, 3: lo (from -8 * csum)
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, base0, 64);
    _tile_loadd(3, base0, 64);
  }
  for (int64_t c = 0; c < chunks; ++c, q += kc / 4 * 16) {
    _tile_loadd(4, x0 + c * kAmxRows * kc, kc);
    _tile_loadd(5, x1 + c * kAmxRows * kc, kc);
    _tile_loadd(6, q, 64);
    _tile_loadd(7, q + fb_next, 64);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    _tile_dpbsud(2, 5, 6);
    _tile_dpbsud(3, 5, 7);
  }
}

inline void amx_store(int32_t* sums) {
  _tile_stored(0, sums, 64);
  _tile_stored(1, sums + 256, 64);
  _tile_stored(2, sums + 512, 64);
  _tile_stored(3, sums + 768, 64);
}

// One unit's sums into y (rows r of y at y + r * 64, the unit's 32 outputs first): W4A8 rows
// 0..31 (tiles 0, 1 and 2, 3), the 15-bit form rows 0..15 (128 * hi + lo).
template <bool A8>
__attribute__((always_inline)) inline void amx_finish(const int32_t* sums, int rows,
                                                      const float* sc, const float* ze,
                                                      const float* step, const float* xsum,
                                                      int64_t ldm, float* y) {
  for (int r = 0; r < rows; ++r) {
    const __m512 st = _mm512_set1_ps(step[r * ldm]), xs = _mm512_set1_ps(xsum[r * ldm]);
    const int32_t* t = sums + (A8 && r >= kAmxRows ? 512 : 0) + (r % kAmxRows) * 16;
    for (int i = 0; i < 2; ++i) {
      const __m512i a = _mm512_load_si512(t + 256 * i);
      const __m512i dot = A8 ? _mm512_slli_epi32(a, 7)
                             : _mm512_add_epi32(_mm512_slli_epi32(a, 7),
                                                _mm512_load_si512(t + 512 + 256 * i));
      float* o = y + r * kBlockN + 16 * i;
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                 _mm512_mul_ps(_mm512_load_ps(sc + 16 * i), st),
                                 _mm512_load_ps(o));
      v = _mm512_fmadd_ps(_mm512_load_ps(ze + 16 * i), xs, v);
      _mm512_store_ps(o, v);
    }
  }
}

// Rows 0 .. M - 1 of x times one full block (wb: its first byte; sz: its first (scale, zero)
// pair of group 0), into out (row m at out + m * ldo). xt_hi, xt_lo: x's codes as tiles
// (amx_tiles_of_x, rows padded to a multiple of 32; lo unused for W4A8). The thread's tiles are
// configured for chunks of kc.
template <bool A8>
void block_amx(const uint8_t* wb, const at::BFloat16* sz, int64_t n_total, int64_t K, int64_t gs,
               int kc, const FixedX& fx, const int8_t* xt_hi, const int8_t* xt_lo, int64_t M,
               AmxScratch& s, at::BFloat16* out, int64_t ldo) {
  const int64_t G = K / gs, chunks = gs / kc;
  constexpr int kUnitRows = A8 ? 2 * kAmxRows : kAmxRows;  // rows of x a unit
  s.qb.resize(K / 4 * kBlockN), s.sc.resize(G * kBlockN), s.ze.resize(G * kBlockN);
  const int64_t fb_next = gs / 4 * 16;  // dwords from one 16 outputs' quads of a group to the next
  for (int64_t g = 0; g < G; ++g) {
    unpack64_quads(wb + g * gs * kBlockN / 2, gs, s.qb.data() + g * gs / 4 * kBlockN, 16,
                   fb_next);
    scales_zeros64(sz + g * n_total * 2, s.sc.data() + g * kBlockN, s.ze.data() + g * kBlockN);
  }
  for (int64_t m0 = 0; m0 < M; m0 += kAmxPassRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kAmxPassRows, M - m0));
    const int64_t nt = (rows + kUnitRows - 1) / kUnitRows;  // units of rows this pass
    const int64_t units = G * 2 * nt;  // (group, outputs 0..31 or 32..63, rows), rows inner
    std::fill(s.y, s.y + rows * kBlockN, 0.0f);
    auto issue = [&](int64_t u) {
      const int64_t t = u % nt, half = u / nt % 2, g = u / nt / 2;
      const int64_t r0 = t * kUnitRows;  // the unit's first row in this pass
      int32_t* b0 = s.base + r0 * 16;
      if (half == 0)  // the group's starting values (a unit's tiles loaded them before)
        for (int r = 0; r < kUnitRows; ++r) {
          const int32_t csum = r0 + r < rows ? fx.csum[(m0 + r0 + r) * G + g] : 0;
          _mm512_store_si512(b0 + 16 * r, _mm512_set1_epi32(A8 ? -8 * (csum / 128) : -8 * csum));
        }
      const int32_t* q = s.qb.data() + g * gs / 4 * kBlockN + half * 2 * fb_next;
      const int64_t at = (m0 + r0) * K + g * gs * kAmxRows;
      if constexpr (A8)
        amx_issue<true>(q, fb_next, xt_hi + at, xt_hi + at + kAmxRows * K, chunks, kc, b0,
                        b0 + kAmxRows * 16);
      else
        amx_issue<false>(q, fb_next, xt_hi + at, xt_lo + at, chunks, kc, b0, b0);
    };
    issue(0);
    for (int64_t u = 0; u < units; ++u) {
      int32_t* sums = s.sums[u & 1];
      amx_store(sums);
      if (u + 1 < units) issue(u + 1);  // the tile unit goes on while this unit is finished
      const int64_t t = u % nt, g = u / nt / 2, off = u / nt % 2 * 32, r0 = t * kUnitRows;
      amx_finish<A8>(sums, static_cast<int>(std::min<int64_t>(kUnitRows, rows - r0)),
                     s.sc.data() + g * kBlockN + off, s.ze.data() + g * kBlockN + off,
                     fx.step.data() + (m0 + r0) * G + g, fx.xsum.data() + (m0 + r0) * G + g, G,
                     s.y + r0 * kBlockN + off);
    }
    for (int r = 0; r < rows; ++r) store64(s.y + r * kBlockN, out + (m0 + r) * ldo);
  }
}

#define OMNI_AMX_KERNELS 1
#endif  // OMNI_AMX

#if defined(OMNI_AMX) || defined(OMNI_AVX512BF16)
// ---- W4A16's many-row branch on bf16 products (int4_tile_mm): the weights dequantized to bf16
// (dequant64's values: fma(q - 8, scale, zero) rounded to nearest even) straight into the layout
// the products read, and multiplied there with fp32 sums over all of K, as vLLM's bf16 linear
// multiplies (oneDNN: also fp32 sums of bf16 products, in its own order). No W^T in memory, no
// torch.mm per chunk (int4_dequant_mm). The amx set multiplies on AMX-BF16 tiles (tdpbf16ps),
// the avx512bf16 set on AVX512_BF16 registers (vdpbf16ps): the same weights, the same layout.
// A panel is kMmPanelN outputs (4 full blocks) by a k-panel of up to kMmPanelK: dequantized once
// into the thread's buffer (256 KiB at 512 k, L2), then multiplied by every row of x, the sums
// kept in memory (fp32 [rows][256]) from one k-panel to the next.
constexpr int64_t kMmPanelN = 4 * kBlockN;
#ifdef OMNI_AMX
constexpr int64_t kMmPanelK = 512;
#else
// 256: each 64 outputs' k-panel of W^T is 32 KiB, L1 while every row of x passes it. On the AMD
// Zen 5 (one thread, its CPU time, beside another job), a 3B forward's linears at 128 and 512
// rows took 1.01-1.04x oneDNN's time, against 1.04-1.10x with k-panels of 128 or 512 and
// 1.04-1.10x with steps of 12 rows by 32 outputs.
constexpr int64_t kMmPanelK = 256;
#endif
constexpr int64_t kMmChunkRows = 2048;  // at most this many rows of x a pass (int4_tile_mm)

// Dwords n: bf16(a[n]) low, bf16(b[n]) high, each rounded to nearest even (fp32x16_to_bf16's).
#ifdef OMNI_AVX512BF16
// vcvtne2ps2bf16 rounds alike but flushes a subnormal to zero, which vdpbf16ps would take as
// zero anyway: the same products, in 2 instructions instead of 10 (words: a's 16, then b's 16,
// interleaved by vpermw).
struct PairWords {
  alignas(64) uint16_t words[32];
};
constexpr PairWords pair_words() {
  PairWords q{};
  for (int n = 0; n < 16; ++n) {
    q.words[2 * n] = static_cast<uint16_t>(n);
    q.words[2 * n + 1] = static_cast<uint16_t>(16 + n);
  }
  return q;
}
constexpr PairWords kPairWords = pair_words();
inline __m512i bf16_pairs(__m512 a, __m512 b) {
  return _mm512_permutexvar_epi16(_mm512_load_si512(kPairWords.words),
                                  (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
#else
inline __m512i bf16_pairs(__m512 a, __m512 b) {
  return _mm512_mask_mov_epi16(_mm512_srli_epi32(bf16_rounded(a), 16), 0xAAAAAAAAu,
                               bf16_rounded(b));
}
#endif

// k0 .. k0 + kc - 1 of one full block (wb: its first byte; sz: its (scale, zero) of group 0)
// dequantized as W^T in k pairs: for each 32 outputs h (2 a block) and 32 k s, two 16 k pairs x
// 16 outputs (dword (r, n): k 2r, 2r + 1 of output n; an AMX tile each), 1 KiB each:
// bt + ((h * S + s) * 2 + t) * 256 dwords, S = kc / 32; the block's first h at bt.
inline void dequant_pairs(const uint8_t* wb, const at::BFloat16* sz, int64_t n_total, int64_t k0,
                          int64_t kc, int64_t gs, uint32_t* bt) {
  const __m512 lut = code_table();
  const int64_t S = kc / 32;
  __m512 scale[4], zero[4];
  for (int64_t k = k0; k < k0 + kc; k += 2) {
    if (k % gs == 0)
      for (int j = 0; j < 4; ++j)
        load_scale_zero(sz + (k / gs * n_total + 16 * j) * 2, &scale[j], &zero[j]);
    __m512 v[2][4];
    dequant_k(wb + k * 32, lut, scale, zero, v[0]);
    dequant_k(wb + k * 32 + 32, lut, scale, zero, v[1]);
    const int64_t kk = k - k0, s = kk / 32, r = kk % 32 / 2;
    for (int j = 0; j < 4; ++j)  // outputs 16 j .. 16 j + 15: h = j / 2, t = j % 2
      _mm512_storeu_si512(bt + ((j / 2 * S + s) * 2 + j % 2) * 256 + r * 16,
                         bf16_pairs(v[0][j], v[1][j]));
  }
}

// Where the next k-panel's packed bytes are (kc k of each of nb blocks, block i's at
// first + i * stride; kc 0: this is the last k-panel), for a set that prefetches them.
struct NextKPanel {
  const uint8_t* first;
  int64_t stride, nb, kc;
};

#ifdef OMNI_AMX
constexpr int kMmRows = 32;  // rows of x a step: two A tiles

// The amx set reads x as tiles: for 32 rows mb and 32 k s, two 16 x 32 bf16 tiles (rows 0..15,
// 16..31) of 1 KiB one after the other: xt + ((mb * K / 32 + s) * 2 + t) * 512. Rows past M
// are zeros.
inline void tb_tiles_of_x(const at::BFloat16* x, int64_t m0, int64_t m1, int64_t M, int64_t K,
                          at::BFloat16* xt) {
  for (int64_t m = m0; m < m1; ++m) {
    at::BFloat16* dst = xt + (m / kMmRows * K / 32 * 2 + m % kMmRows / 16) * 512 + m % 16 * 32;
    if (m >= M) {
      for (int64_t s = 0; s < K / 32; ++s) std::memset(dst + s * 1024, 0, 64);
      continue;
    }
    for (int64_t s = 0; s < K / 32; ++s) std::memcpy(dst + s * 1024, x + m * K + s * 32, 64);
  }
}
inline const at::BFloat16* mm_x(const at::BFloat16* x, int64_t M, int64_t K, at::Tensor& xt) {
  const int64_t Mp = (M + kMmRows - 1) / kMmRows * kMmRows;
  xt = at::empty({Mp * K}, at::kBFloat16);
  at::BFloat16* xtp = xt.data_ptr<at::BFloat16>();
  at::parallel_for(0, Mp, kMmRows, [&](int64_t r0, int64_t r1) {
    tb_tiles_of_x(x, r0, r1, M, K, xtp);
  });
  return xtp;
}

// Where Linux refuses AMX: int4_dequant_mm.
inline bool mm_ready() { return amx_ready(); }
// Every tile 16 rows of 64 bytes (C 16 x 16 fp32, A 16 x 32 bf16, B 16 k pairs x 16 outputs):
// the int8 GEMM's configuration for chunks of 64.
inline void mm_begin() { amx_configure(64); }
inline void mm_end() { amx_release(); }

// 32 rows of x (a: their tiles of the k-panel, S steps) times 32 outputs (b: their W^T tiles),
// added into c (fp32, rows ldc apart; first: start from zero). Four fp32 tiles (2 x 2: each
// tile load serves two products).
inline void tb_step(const at::BFloat16* a, const uint32_t* b, int64_t S, float* c, int64_t ldc,
                    bool first) {
  const int64_t ldb = ldc * 4;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, ldb);
    _tile_loadd(1, c + 16, ldb);
    _tile_loadd(2, c + 16 * ldc, ldb);
    _tile_loadd(3, c + 16 * ldc + 16, ldb);
  }
  for (int64_t s = 0; s < S; ++s, a += 1024, b += 512) {
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 512, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 256, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, ldb);
  _tile_stored(1, c + 16, ldb);
  _tile_stored(2, c + 16 * ldc, ldb);
  _tile_stored(3, c + 16 * ldc + 16, ldb);
}

// One k-panel (k0, S steps of 32; bt: its W^T of nb blocks) for all M rows (xt: x's tiles):
// every 32 rows of x (32 KiB: L1 while the panel's 8 column pairs take it) times 32 outputs.
// The next k-panel is not prefetched here.
inline void mm_k_panel(const at::BFloat16* xt, int64_t M, int64_t K, int64_t k0, int64_t S,
                       const uint32_t* bt, int64_t nb, float* c, int64_t ldc, const NextKPanel&) {
  for (int64_t m = 0; m < M; m += kMmRows)
    for (int64_t h = 0; h < 2 * nb; ++h)
      tb_step(xt + (m / kMmRows * K / 32 + k0 / 32) * 1024, bt + h * S * 512, S,
              c + m * ldc + 32 * h, ldc, k0 == 0);
}
#else
// The avx512bf16 set: vdpbf16ps adds, in each fp32 lane, the products of a dword's two bf16 of
// x (one row's k, k + 1, broadcast) and of the weights (one output's k, k + 1): 32 multiply-adds
// an instruction. A step is kRegRows rows of x by kRegVecs * 16 outputs in kRegRows * kRegVecs
// fp32 accumulators over the k-panel; each load of weights serves every row of the step. x is
// read as it is, rows K apart.
constexpr int kMmRows = 1;  // any number of rows
constexpr int kRegRows = 6, kRegVecs = 4;

inline const at::BFloat16* mm_x(const at::BFloat16* x, int64_t, int64_t, at::Tensor&) { return x; }
inline bool mm_ready() { return true; }
inline void mm_begin() {}
inline void mm_end() {}

// R rows of x (x: row 0 at k0) times kRegVecs * 16 outputs whose W^T pairs start at b (vector j:
// b + (j / 2) * S * 512 + (j % 2) * 256, dequant_pairs' layout), added into c.
template <int R>
inline void rb_step(const at::BFloat16* x, int64_t K, const uint32_t* b, int64_t S, float* c,
                    int64_t ldc, bool first) {
  constexpr int J = kRegVecs;
  __m512 acc[R][J];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j)
      acc[i][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * ldc + 16 * j);
  for (int64_t s = 0; s < S; ++s, b += 512, x += 32)
    for (int r = 0; r < 16; ++r) {
      __m512bh w[J];
      for (int j = 0; j < J; ++j)
        w[j] = (__m512bh)_mm512_loadu_si512(b + j / 2 * S * 512 + j % 2 * 256 + r * 16);
      for (int i = 0; i < R; ++i) {
        int32_t pair;
        std::memcpy(&pair, x + i * K + 2 * r, 4);
        const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
        for (int j = 0; j < J; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], a, w[j]);
      }
    }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < J; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, acc[i][j]);
}

// The next k-panel's packed bytes, prefetched into L2 a few lines a step while this k-panel is
// multiplied (steps: how many), so that dequant_pairs finds them there instead of waiting on
// memory.
struct Ahead {
  NextKPanel next;
  int64_t block_lines, lines, per_step, done = 0;
  Ahead(const NextKPanel& p, int64_t steps)
      : next(p), block_lines(p.kc * 32 / 64), lines(p.nb * block_lines),
        per_step((lines + steps - 1) / std::max<int64_t>(1, steps)) {}
  void step() {
    for (int64_t i = 0; i < per_step && done < lines; ++i, ++done)
      _mm_prefetch(reinterpret_cast<const char*>(next.first + done / block_lines * next.stride +
                                                 done % block_lines * 64),
                   _MM_HINT_T1);
  }
};

// rb_step<rows> for 1 <= rows <= R.
template <int R>
inline void rb_rows(int rows, const at::BFloat16* x, int64_t K, const uint32_t* b, int64_t S,
                    float* c, int64_t ldc, bool first) {
  if constexpr (R > 1)
    if (rows < R) return rb_rows<R - 1>(rows, x, K, b, S, c, ldc, first);
  rb_step<R>(x, K, b, S, c, ldc, first);
}

// One k-panel (k0, S steps of 32; bt: its W^T of nb blocks) for all M rows of x (rows K apart):
// each kRegVecs * 16 outputs (their k-panel of W^T: 32 KiB at kRegVecs 4, L1) times every
// kRegRows rows.
inline void mm_k_panel(const at::BFloat16* x, int64_t M, int64_t K, int64_t k0, int64_t S,
                       const uint32_t* bt, int64_t nb, float* c, int64_t ldc,
                       const NextKPanel& next) {
  constexpr int64_t per_block = 4 / kRegVecs;
  Ahead ahead(next, nb * per_block * ((M + kRegRows - 1) / kRegRows));
  for (int64_t u = 0; u < nb * per_block; ++u) {
    const uint32_t* bu = bt + (u / per_block * 2 + u % per_block * kRegVecs / 2) * S * 512;
    for (int64_t m = 0; m < M; m += kRegRows) {
      rb_rows<kRegRows>(static_cast<int>(std::min<int64_t>(kRegRows, M - m)), x + m * K + k0, K,
                        bu, S, c + m * ldc + u * 16 * kRegVecs, ldc, k0 == 0);
      ahead.step();
    }
  }
}
#endif

// The full blocks [b0, b1) (at most 4: one panel) for all M rows (xm: x as mm_x laid it) into
// out (row m at out + m * ldo, the panel's first output at out).
inline void mm_panel(const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t b0,
                     int64_t b1, int64_t K, int64_t gs, const at::BFloat16* xm, int64_t M,
                     std::vector<uint32_t>& bt, std::vector<float>& c, at::BFloat16* out,
                     int64_t ldo) {
  const int64_t kcmax = std::max<int64_t>(gs, kMmPanelK / gs * gs), nb = b1 - b0;
  const int64_t Mp = (M + kMmRows - 1) / kMmRows * kMmRows, ldc = nb * kBlockN;
  if (static_cast<int64_t>(bt.size()) < kcmax * kMmPanelN / 2) bt.resize(kcmax * kMmPanelN / 2);
  if (static_cast<int64_t>(c.size()) < Mp * ldc) c.resize(Mp * ldc);
  for (int64_t k0 = 0; k0 < K; k0 += kcmax) {
    const int64_t kc = std::min(kcmax, K - k0), S = kc / 32;
    for (int64_t b = b0; b < b1; ++b)
      dequant_pairs(w + b * kBlockN * K / 2, sz + b * kBlockN * 2, n_total, k0, kc, gs,
                    bt.data() + (b - b0) * 2 * S * 512);
    const NextKPanel next{w + b0 * kBlockN * K / 2 + (k0 + kc) * 32, kBlockN * K / 2, nb,
                          std::min(kcmax, K - k0 - kc)};
    mm_k_panel(xm, M, K, k0, S, bt.data(), nb, c.data(), ldc, next);
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b)
      store64(c.data() + m * ldc + b * kBlockN, out + m * ldo + b * kBlockN);
}
#define OMNI_BF16_MM_KERNELS 1
#endif  // OMNI_AMX || OMNI_AVX512BF16


inline void tile(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  switch (rows) {
    case 6: return tile_vnni<6>(gg, x, o);
    case 5: return tile_vnni<5>(gg, x, o);
    case 4: return tile_vnni<4>(gg, x, o);
    case 3: return tile_vnni<3>(gg, x, o);
    case 2: return tile_vnni<2>(gg, x, o);
    default: return tile_vnni<1>(gg, x, o);
  }
}

// The greedy argmax: 16 values per instruction, a pass for the maximum and one for the first
// index that holds it (torch's argmax compares one value at a time: ~36 us at a 32k vocabulary).
inline __m512 load16(const at::BFloat16* p) { return bf16x16_to_fp32(p); }
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16_masked(const at::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16_masked(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

template <typename T>
int64_t argmax(const T* row, int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load16(row + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
  if (tail) {
    const __m512 v =
        _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), tail, load16_masked(row + i, tail));
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  if (nan) return -1;
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 eq = _mm512_cmp_ps_mask(load16(row + i), m, _CMP_EQ_OQ);
    if (eq) return i + __builtin_ctz(eq);
  }
  const __mmask16 eq = _mm512_mask_cmp_ps_mask(tail, load16_masked(row + i, tail), m, _CMP_EQ_OQ);
  return eq ? i + __builtin_ctz(eq) : 0;  // all -inf: the first, as torch's argmax
}

}  // namespace isa
}  // namespace omni

#include "int4_ops.h"
