// cpu_int4's AVX2 kernel set (AVX2 + FMA), torch.ops namespace vllm_omni_avx2: for x86 CPUs
// without AVX-512 (AMD Zen 2/3, Intel before Skylake-SP), and for AVX-512 CPUs without
// AVX512_VNNI/VBMI. The layout, the arithmetic every set shares and the ops are in int4_base.h
// and int4_ops.h; this set gives the same bits as the AVX-512 one.
//
// The GEMV takes two k at a time: the 32 bytes of k and of k + 1 are interleaved byte by byte
// (vpunpck{l,h}bw), so each 16-bit word holds one row's two codes in a nibble of each byte: the
// low nibbles are rows j, the high ones rows j + 32. vpmaddubsw multiplies those unsigned code
// pairs by x's signed fixed-point byte pairs (hi[k], hi[k+1]) and (lo[k], lo[k+1]) and adds each
// pair into an int16 lane: 16 rows, two k per instruction. Eight such sums (16 k) fit in int16
// (at most 16 * 15 * 128 = 30720), then they widen into int32 as 128 * hi + lo. The weights are
// prefetched 4 KiB ahead, into L2 or non-temporally (set_weight_prefetch).

#include <immintrin.h>

#include "int4_base.h"

namespace omni {
namespace isa {

constexpr const char* kName = "avx2";
constexpr int kRows = 1;  // 8 int16 and 8 int32 accumulators for one row of x fill the registers
constexpr int kStreamBlocks = 1;
constexpr int kGemvStreams = 1;

// 8 bf16 at p as fp32 (exact: bf16 is the top half of an fp32).
inline __m256 bf16x8_to_fp32(const at::BFloat16* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// Round to nearest even, as torch's float -> bfloat16 conversion does (no NaN reaches here).
inline __m128i fp32x8_to_bf16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// 8 (scale, zero) bf16 pairs starting at p, as two fp32 vectors.
inline void load_scale_zero(const at::BFloat16* p, __m256* scale, __m256* zero) {
  const __m256i pair = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  *scale = _mm256_castsi256_ps(_mm256_slli_epi32(pair, 16));
  *zero = _mm256_castsi256_ps(_mm256_and_si256(pair, _mm256_set1_epi32(0xFFFF0000)));
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// fixed_point_scalar<A8>'s bits: lanes 0..7 and 8..15 of the 16 partial sums in two registers.
template <bool A8>
void fixed_point(const at::BFloat16* x, int64_t K, int64_t gs, int8_t* hi, int8_t* lo,
                 float* step, int32_t* csum, float* xsum) {
  constexpr int kMax = A8 ? kInt8Max : kFixedMax;
  constexpr float kSteps = A8 ? kInt8Steps : static_cast<float>(kFixedMax);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t g = 0; g < K / gs; ++g) {
    __m256 amax = _mm256_setzero_ps(), s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      const __m256 v0 = bf16x8_to_fp32(x + k), v1 = bf16x8_to_fp32(x + k + 8);
      amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_and_ps(v0, sign), _mm256_and_ps(v1, sign)));
      s0 = _mm256_add_ps(s0, v0);
      s1 = _mm256_add_ps(s1, v1);
    }
    const float top = hmax(amax);
    alignas(32) float lanes[16];
    _mm256_store_ps(lanes, s0);
    _mm256_store_ps(lanes + 8, s1);
    xsum[g] = reduce16(lanes);
    step[g] = top / kSteps;
    const __m256 inv = _mm256_set1_ps(top > 0 ? kMax / top : 0.0f);
    const __m256i bound = _mm256_set1_epi32(kMax);
    const __m256i nbound = _mm256_set1_epi32(-kMax);
    const __m256i low7 = _mm256_set1_epi32(127);
    __m256i codes = _mm256_setzero_si256();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 8) {
      __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(bf16x8_to_fp32(x + k), inv));
      c = _mm256_max_epi32(_mm256_min_epi32(c, bound), nbound);
      codes = _mm256_add_epi32(codes, c);
      // hi (W4A8: c) in -128..127 and lo (W4A8: 0) in 0..127 fit the saturating packs: per
      // 128-bit lane the bytes are hi of 4 k, then lo of the same 4 k
      const __m256i h = A8 ? c : _mm256_srai_epi32(c, 7);
      const __m256i l = A8 ? _mm256_setzero_si256() : _mm256_and_si256(c, low7);
      const __m256i words = _mm256_packs_epi32(h, l);
      const __m256i bytes = _mm256_packs_epi16(words, words);
      const __m128i b0 = _mm256_castsi256_si128(bytes), b1 = _mm256_extracti128_si256(bytes, 1);
      const int32_t h0 = _mm_cvtsi128_si32(b0), l0 = _mm_extract_epi32(b0, 1);
      const int32_t h1 = _mm_cvtsi128_si32(b1), l1 = _mm_extract_epi32(b1, 1);
      std::memcpy(hi + k, &h0, 4), std::memcpy(hi + k + 4, &h1, 4);
      std::memcpy(lo + k, &l0, 4), std::memcpy(lo + k + 4, &l1, 4);
    }
    const int32_t total = hsum_epi32(codes);
    csum[g] = A8 ? 128 * total : total;
  }
}

// Which int32 accumulator (8 rows each, in row order) the half `h` of int16 sum `i` widens into:
// sum 0 holds rows 0..7 | 16..23, 1: 8..15 | 24..31, 2: 32..39 | 48..55, 3: 40..47 | 56..63.
constexpr int row_group(int i, int h) { return (i / 2) * 4 + (i % 2) + 2 * h; }

// A8: x is W4A8's int8 codes (lo = 0): the lo products are left out.
template <int Hint, bool A8 = false>
void block64(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
             int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
             int64_t ldo) {
  constexpr int kHint = Hint ? _MM_HINT_NTA : _MM_HINT_T1;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int64_t G = K / gs;
  for (int m = 0; m < rows; ++m) {
    const int8_t* xh = fx.hi.data() + (m0 + m) * K;
    const int8_t* xl = fx.lo.data() + (m0 + m) * K;
    __m256 o[8];
    for (int r = 0; r < 8; ++r) o[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; ++g) {
      __m256i acc[8];
      for (int r = 0; r < 8; ++r) acc[r] = _mm256_setzero_si256();
      const uint8_t* p = w + g * gs * 32;
      for (int64_t k0 = g * gs; k0 < (g + 1) * gs; k0 += 16) {
        __m256i sh[4], sl[4];
        for (int i = 0; i < 4; ++i) sh[i] = sl[i] = _mm256_setzero_si256();
        for (int64_t k = k0; k < k0 + 16; k += 2, p += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(p) + 4096, static_cast<_mm_hint>(kHint));
          const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
          const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
          const __m256i p0 = _mm256_unpacklo_epi8(a, b), p1 = _mm256_unpackhi_epi8(a, b);
          const __m256i q[4] = {_mm256_and_si256(p0, nibble), _mm256_and_si256(p1, nibble),
                                _mm256_and_si256(_mm256_srli_epi16(p0, 4), nibble),
                                _mm256_and_si256(_mm256_srli_epi16(p1, 4), nibble)};
          int16_t h2, l2;
          std::memcpy(&h2, xh + k, sizeof(h2));
          const __m256i vh = _mm256_set1_epi16(h2);
          for (int i = 0; i < 4; ++i)
            sh[i] = _mm256_add_epi16(sh[i], _mm256_maddubs_epi16(q[i], vh));
          if constexpr (!A8) {
            std::memcpy(&l2, xl + k, sizeof(l2));
            const __m256i vl = _mm256_set1_epi16(l2);
            for (int i = 0; i < 4; ++i)
              sl[i] = _mm256_add_epi16(sl[i], _mm256_maddubs_epi16(q[i], vl));
          }
        }
        for (int i = 0; i < 4; ++i)
          for (int h = 0; h < 2; ++h) {
            const __m128i hh = h ? _mm256_extracti128_si256(sh[i], 1) : _mm256_castsi256_si128(sh[i]);
            __m256i& a = acc[row_group(i, h)];
            const __m256i hi7 = _mm256_slli_epi32(_mm256_cvtepi16_epi32(hh), 7);
            if constexpr (A8) {
              a = _mm256_add_epi32(a, hi7);
            } else {
              const __m128i ll =
                  h ? _mm256_extracti128_si256(sl[i], 1) : _mm256_castsi256_si128(sl[i]);
              a = _mm256_add_epi32(a, _mm256_add_epi32(hi7, _mm256_cvtepi16_epi32(ll)));
            }
          }
      }
      const int64_t mg = (m0 + m) * G + g;
      const __m256i bias = _mm256_set1_epi32(8 * fx.csum[mg]);
      const __m256 step = _mm256_set1_ps(fx.step[mg]), xsum = _mm256_set1_ps(fx.xsum[mg]);
      const at::BFloat16* s = sz + (g * n_total + n0) * 2;
      for (int r = 0; r < 8; ++r) {
        __m256 scale, zero;
        load_scale_zero(s + 16 * r, &scale, &zero);
        const __m256i dot = _mm256_sub_epi32(acc[r], bias);
        o[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(scale, step), o[r]);
        o[r] = _mm256_fmadd_ps(zero, xsum, o[r]);
      }
    }
    for (int r = 0; r < 8; ++r)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + (m0 + m) * ldo + n0 + 8 * r),
                       fp32x8_to_bf16(o[r]));
  }
}

// One group of W^T for a full block: gs rows of 64 contiguous bf16, `ld` apart.
void dequant64(const uint8_t* p, const at::BFloat16* sz, int64_t gs, at::BFloat16* out,
               int64_t ld) {
  __m256 scale[8], zero[8];
  for (int r = 0; r < 8; ++r) load_scale_zero(sz + 16 * r, &scale[r], &zero[r]);
  const __m256i low = _mm256_set1_epi32(0x0F);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t k = 0; k < gs; ++k, p += 32, out += ld) {
    for (int c = 0; c < 4; ++c) {  // bytes 8c .. 8c + 7: rows 8c.. (low) and 32 + 8c.. (high)
      const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * c)));
      const __m256 qlo = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(d, low)), eight);
      const __m256 qhi = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), eight);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * c),
                       fp32x8_to_bf16(_mm256_fmadd_ps(qlo, scale[c], zero[c])));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 32 + 8 * c),
                       fp32x8_to_bf16(_mm256_fmadd_ps(qhi, scale[4 + c], zero[4 + c])));
    }
  }
}

// ---- The GEMM (int4_base.h): vpmaddwd multiplies 8 dwords of code pairs (q[2kp], q[2kp+1]) by
// one row's broadcast pair of fixed-point codes, giving both products' sum per int32 lane (exact:
// at most 2 * 15 * 16383), added into the row's accumulators. A tile is 2 rows x 32 outputs at
// a time (8 accumulators, 4 registers of codes), over the two halves of the block.

// The unpacking: 16 rows' codes of k (a) and k + 1 (b), as bytes, into 16 dwords of pairs.
inline void pairs16(__m128i a, __m128i b, int32_t* qb) {
  const __m256i aw = _mm256_cvtepu8_epi16(a), bw = _mm256_cvtepu8_epi16(b);
  const __m256i lo = _mm256_unpacklo_epi16(aw, bw), hi = _mm256_unpackhi_epi16(aw, bw);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm256_permute2x128_si256(lo, hi, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
}

inline void unpack64(const uint8_t* p, int64_t gs, int32_t* qb) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t kp = 0; kp < gs / 2; ++kp, p += 64, qb += kBlockN) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    const __m256i al = _mm256_and_si256(a, nibble), bl = _mm256_and_si256(b, nibble);
    const __m256i ah = _mm256_and_si256(_mm256_srli_epi16(a, 4), nibble);
    const __m256i bh = _mm256_and_si256(_mm256_srli_epi16(b, 4), nibble);
    pairs16(_mm256_castsi256_si128(al), _mm256_castsi256_si128(bl), qb);  // rows 0..15
    pairs16(_mm256_extracti128_si256(al, 1), _mm256_extracti128_si256(bl, 1), qb + 16);
    pairs16(_mm256_castsi256_si128(ah), _mm256_castsi256_si128(bh), qb + 32);  // rows 32..47
    pairs16(_mm256_extracti128_si256(ah, 1), _mm256_extracti128_si256(bh, 1), qb + 48);
  }
}

constexpr int kTileRows = 2;

// The float finishing of one group for row r and outputs h * 32 .. h * 32 + 31 (W4A8's, Shift 7:
// the accumulators hold sum q * c, the 15-bit form's sum over 128).
template <int Shift = 0>
inline void finish_row32(const GemmGroup& gg, const GemmRows& x, int r, int h,
                         const __m256i (&acc)[4], float* o) {
  const __m256i bias = _mm256_set1_epi32(8 * x.csum[r * x.ldm]);
  const __m256 step = _mm256_set1_ps(x.step[r * x.ldm]), xsum = _mm256_set1_ps(x.xsum[r * x.ldm]);
  for (int i = 0; i < 4; ++i) {
    const int j = 32 * h + 8 * i;
    float* y = o + r * kBlockN + j;
    const __m256i sum = Shift ? _mm256_slli_epi32(acc[i], Shift) : acc[i];
    const __m256i dot = _mm256_sub_epi32(sum, bias);
    __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),
                               _mm256_mul_ps(_mm256_load_ps(gg.sc + j), step), _mm256_loadu_ps(y));
    v = _mm256_fmadd_ps(_mm256_load_ps(gg.ze + j), xsum, v);
    _mm256_storeu_ps(y, v);
  }
}

// Named accumulators, not an array: GCC keeps arrays of vectors this size in memory.
template <int R>
void tile_madd(const GemmGroup& gg, const GemmRows& x, float* o) {
  for (int h = 0; h < 2; ++h) {
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
    __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    const int32_t* qb = gg.qb + 32 * h;
    const int32_t* c2 = x.c2;  // row r's pair kp at c2[kp * kTileRows + r]
    for (int64_t kp = 0; kp < gg.kpairs; ++kp, qb += kBlockN, c2 += kTileRows) {
      const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb));
      const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 8));
      const __m256i q2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 16));
      const __m256i q3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qb + 24));
      const __m256i c0 = _mm256_set1_epi32(c2[0]);
      a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(q0, c0));
      a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(q1, c0));
      a02 = _mm256_add_epi32(a02, _mm256_madd_epi16(q2, c0));
      a03 = _mm256_add_epi32(a03, _mm256_madd_epi16(q3, c0));
      if constexpr (R > 1) {
        const __m256i c1 = _mm256_set1_epi32(c2[1]);
        a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(q0, c1));
        a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(q1, c1));
        a12 = _mm256_add_epi32(a12, _mm256_madd_epi16(q2, c1));
        a13 = _mm256_add_epi32(a13, _mm256_madd_epi16(q3, c1));
      }
    }
    finish_row32(gg, x, 0, h, {a00, a01, a02, a03}, o);
    if constexpr (R > 1) finish_row32(gg, x, 1, h, {a10, a11, a12, a13}, o);
  }
}

inline void tile(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  if (rows == 2)
    tile_madd<2>(gg, x, o);
  else
    tile_madd<1>(gg, x, o);
}

// ---- W4A8's GEMM: vpmaddubsw multiplies 8 dwords of 4 codes (one output's k = 4kq .. 4kq + 3)
// by one row's broadcast 4 int8 codes of x into int16 pair sums (at most 2 * 15 * 127 = 3810),
// two kq's are added in int16 (7620), then vpmaddwd by ones widens them into the int32
// accumulators: 256 multiply-adds in 5 instructions a register, where the 15-bit tile takes 8.
#define OMNI_A8_KERNELS 1

template <int Hint>
void block64_a8(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
                int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
                int64_t ldo) {
  block64<Hint, true>(rows, w, sz, n_total, n0, K, gs, fx, m0, out, ldo);
}

// One group of a full block as dwords of 4 codes, qb[kq * 64 + j] (int4_ops.h): 4 k's 32 bytes
// interleaved byte by byte, then by 16-bit pairs; AVX2 does both within 128-bit lanes, and the
// lane swaps at the end put the rows in order.
inline void quads16(__m256i a, __m256i b, __m256i c, __m256i d, int32_t* qb) {
  const __m256i ab_lo = _mm256_unpacklo_epi8(a, b), ab_hi = _mm256_unpackhi_epi8(a, b);
  const __m256i cd_lo = _mm256_unpacklo_epi8(c, d), cd_hi = _mm256_unpackhi_epi8(c, d);
  const __m256i q0 = _mm256_unpacklo_epi16(ab_lo, cd_lo);  // rows 0..3 | 16..19
  const __m256i q1 = _mm256_unpackhi_epi16(ab_lo, cd_lo);  // 4..7 | 20..23
  const __m256i q2 = _mm256_unpacklo_epi16(ab_hi, cd_hi);  // 8..11 | 24..27
  const __m256i q3 = _mm256_unpackhi_epi16(ab_hi, cd_hi);  // 12..15 | 28..31
  auto* out = reinterpret_cast<__m256i*>(qb);
  _mm256_storeu_si256(out, _mm256_permute2x128_si256(q0, q1, 0x20));      // rows 0..7
  _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(q2, q3, 0x20));  // 8..15
  _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(q0, q1, 0x31));  // 16..23
  _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(q2, q3, 0x31));  // 24..31
}

inline void unpack64_quads(const uint8_t* p, int64_t gs, int32_t* qb) {
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  for (int64_t kq = 0; kq < gs / 4; ++kq, p += 128, qb += kBlockN) {
    __m256i v[4];
    for (int t = 0; t < 4; ++t)
      v[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * t));
    quads16(_mm256_and_si256(v[0], nibble), _mm256_and_si256(v[1], nibble),
            _mm256_and_si256(v[2], nibble), _mm256_and_si256(v[3], nibble), qb);  // rows 0..31
    quads16(_mm256_and_si256(_mm256_srli_epi16(v[0], 4), nibble),
            _mm256_and_si256(_mm256_srli_epi16(v[1], 4), nibble),
            _mm256_and_si256(_mm256_srli_epi16(v[2], 4), nibble),
            _mm256_and_si256(_mm256_srli_epi16(v[3], 4), nibble), qb + 32);  // rows 32..63
  }
}

// Named accumulators, as tile_madd. gg.kpairs: quads of k (gs / 4: even, gs being a multiple of
// 16).
template <int R>
void tile_quads(const GemmGroup& gg, const GemmRows& x, float* o) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a02 = a00, a03 = a00;
    __m256i a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    const int32_t* qb = gg.qb + 32 * h;
    const int32_t* c4 = x.c2;  // row r's quad kq at c4[kq * kTileRows + r]
    for (int64_t kq = 0; kq < gg.kpairs; kq += 2, qb += 2 * kBlockN, c4 += 2 * kTileRows) {
      const auto* q = reinterpret_cast<const __m256i*>(qb);
      const auto* n = reinterpret_cast<const __m256i*>(qb + kBlockN);  // kq + 1
#define OMNI_SUM(acc, i, c, d)                                                                  \
  acc = _mm256_add_epi32(                                                                     \
      acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256(q + i), c), \
                                              _mm256_maddubs_epi16(_mm256_loadu_si256(n + i), d)), \
                             ones));
      const __m256i c0 = _mm256_set1_epi32(c4[0]), d0 = _mm256_set1_epi32(c4[kTileRows]);
      OMNI_SUM(a00, 0, c0, d0) OMNI_SUM(a01, 1, c0, d0) OMNI_SUM(a02, 2, c0, d0)
      OMNI_SUM(a03, 3, c0, d0)
      if constexpr (R > 1) {
        const __m256i c1 = _mm256_set1_epi32(c4[1]), d1 = _mm256_set1_epi32(c4[kTileRows + 1]);
        OMNI_SUM(a10, 0, c1, d1) OMNI_SUM(a11, 1, c1, d1) OMNI_SUM(a12, 2, c1, d1)
        OMNI_SUM(a13, 3, c1, d1)
      }
#undef OMNI_SUM
    }
    finish_row32<7>(gg, x, 0, h, {a00, a01, a02, a03}, o);
    if constexpr (R > 1) finish_row32<7>(gg, x, 1, h, {a10, a11, a12, a13}, o);
  }
}

inline void tile8(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  if (rows == 2)
    tile_quads<2>(gg, x, o);
  else
    tile_quads<1>(gg, x, o);
}

// 64 fp32 outputs of a tile to bf16, as the GEMV rounds them.
inline void store64(const float* o, at::BFloat16* out) {
  for (int i = 0; i < 8; ++i)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 8 * i),
                     fp32x8_to_bf16(_mm256_loadu_ps(o + 8 * i)));
}

inline __m256 load8(const at::BFloat16* p) { return bf16x8_to_fp32(p); }
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

// The greedy argmax, 8 values per instruction; the last n % 8 one by one.
template <typename T>
int64_t argmax(const T* row, int64_t n) {
  __m256 best = _mm256_set1_ps(-INFINITY);
  int nan = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = load8(row + i);
    nan |= _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_max_ps(best, v);
  }
  float top = hmax(best);
  for (int64_t j = i; j < n; ++j) {
    const float v = static_cast<float>(row[j]);
    if (std::isnan(v)) return -1;
    top = std::max(top, v);
  }
  if (nan) return -1;
  const __m256 m = _mm256_set1_ps(top);
  for (int64_t j = 0; j + 8 <= n; j += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(load8(row + j), m, _CMP_EQ_OQ));
    if (eq) return j + __builtin_ctz(eq);
  }
  for (int64_t j = i; j < n; ++j)
    if (static_cast<float>(row[j]) == top) return j;
  return 0;  // all -inf: the first, as torch's argmax
}

}  // namespace isa
}  // namespace omni

#include "int4_ops.h"
