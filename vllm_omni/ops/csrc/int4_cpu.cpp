// Native kernels for cpu_int4 on torch's CPU int4 pack (AVX-512 builds of torch).
//
// The pack is the one torch.ops.aten._convert_weight_to_int4pack_for_cpu makes on AVX-512
// builds (see vllm_omni/ops/int4_pack.py): blocks of 64 output rows, k-major inside a block,
// 32 bytes per k: byte j holds row j's code in its low nibble and row j + 32's in its high one.
// scales_zeros is bf16 [G, N, 2] (scale, zero); w = (q - 8) * scale + zero.
//
// vllm_omni_C::int4_gemv(x, packed, scales_zeros, group_size, bf16_dot=True): y = x @ W^T for a
//   few rows. Why not torch's _weight_int4pack_mm_for_cpu: it applies scale and zero to every
//   weight and streams a 0.5B model's int4 weights at about 12.5 GB/s on two cores of this
//   machine. Here the sum over a group is taken on (q - 8) alone, and scale and zero are applied
//   once per group:
//     y[n] = sum_g scale[g,n] * sum_{k in g} (q[n,k] - 8) x[k] + zero[g,n] * sum_{k in g} x[k].
//   Two inner loops compute the group sums. With AVX512_BF16 and AVX512_VBMI (and bf16_dot),
//   codes become bf16 through a table and vdpbf16ps takes two k per instruction (block_dot,
//   about 21.5 GB/s on that stream); otherwise codes become fp32 through a table (vpermps) and
//   fp32 FMAs take one k (block, about 20 GB/s). Rows of x go four at a time, sharing the
//   converted codes; the weights are prefetched 4 KiB ahead into L2.
//
// vllm_omni_C::int4_dequant_t(packed, scales_zeros, group_size, n_begin, n_end): the bf16
//   W^T [K, n_end - n_begin] of those output rows, for the many-row path (a bf16 matmul then
//   runs on it). Same values as vllm_omni.ops.int4_pack.dequantize_t: (q - 8) * scale is exact
//   in fp32, adding zero rounds once, and the result is rounded to nearest even bf16.
//
// Only full 64-row blocks are handled; the caller checks N % 64 == 0 (and the layout).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

namespace {

constexpr int kBlockN = 64;
constexpr int kRows = 4;  // rows of x per pass over the weights

// Round to nearest even, as torch's float -> bfloat16 conversion does (no NaN reaches here:
// the inputs are finite bf16 and finite codes).
inline __m256i fp32x16_to_bf16(__m512 v) {
  __m512i bits = _mm512_castps_si512(v);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
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

void check_pack(const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t K,
                int64_t group_size) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: uint8");
  TORCH_CHECK(scales_zeros.dim() == 3 && scales_zeros.size(2) == 2 &&
                  scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous(),
              "scales_zeros: bf16 [G, N, 2]");
  const int64_t N = scales_zeros.size(1);
  TORCH_CHECK(group_size > 0 && group_size % 16 == 0 && K == scales_zeros.size(0) * group_size,
              "K must be G * group_size, group_size a multiple of 16");
  TORCH_CHECK(N % kBlockN == 0, "N must be a multiple of 64");
  TORCH_CHECK(packed.numel() == N * K / 2, "packed must hold N * K / 2 bytes");
}

// Sets a block's [M][4] accumulators to 0.
template <int M>
inline void zero(__m512 (*acc)[M][4]) {
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j) (*acc)[m][j] = _mm512_setzero_ps();
}

// One block of 64 output rows, `m` (1..kRows) rows of x. xf: fp32 [m, K]; xsum: fp32 [m, G].
template <int M>
void block(const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0, int64_t K,
           int64_t gs, const float* xf, const float* xsum, at::BFloat16* out, int64_t ldo) {
  const __m512 lut = code_table();
  const int64_t G = K / gs;
  __m512 o[M][4];
  zero(&o);
  for (int64_t g = 0; g < G; ++g) {
    __m512 a[M][4];
    zero(&a);
    const uint8_t* p = w + g * gs * 32;
    const float* xg = xf + g * gs;
    // Two k per iteration into two sets of accumulators: eight independent FMA chains, so the
    // FMA latency is hidden behind the table lookups.
    __m512 b[M][4];
    zero(&b);
    for (int64_t k = 0; k < gs; k += 2, p += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p) + 4096, _MM_HINT_T1);
      __m512i d0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      __m512i d1 =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
      __m512i e0 =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32)));
      __m512i e1 =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 48)));
      __m512 q0 = _mm512_permutexvar_ps(d0, lut);                         // rows 0..15
      __m512 q1 = _mm512_permutexvar_ps(d1, lut);                         // rows 16..31
      __m512 q2 = _mm512_permutexvar_ps(_mm512_srli_epi32(d0, 4), lut);  // rows 32..47
      __m512 q3 = _mm512_permutexvar_ps(_mm512_srli_epi32(d1, 4), lut);  // rows 48..63
      __m512 r0 = _mm512_permutexvar_ps(e0, lut);
      __m512 r1 = _mm512_permutexvar_ps(e1, lut);
      __m512 r2 = _mm512_permutexvar_ps(_mm512_srli_epi32(e0, 4), lut);
      __m512 r3 = _mm512_permutexvar_ps(_mm512_srli_epi32(e1, 4), lut);
      for (int m = 0; m < M; ++m) {
        __m512 xk = _mm512_set1_ps(xg[m * K + k]);
        __m512 xl = _mm512_set1_ps(xg[m * K + k + 1]);
        a[m][0] = _mm512_fmadd_ps(q0, xk, a[m][0]);
        a[m][1] = _mm512_fmadd_ps(q1, xk, a[m][1]);
        a[m][2] = _mm512_fmadd_ps(q2, xk, a[m][2]);
        a[m][3] = _mm512_fmadd_ps(q3, xk, a[m][3]);
        b[m][0] = _mm512_fmadd_ps(r0, xl, b[m][0]);
        b[m][1] = _mm512_fmadd_ps(r1, xl, b[m][1]);
        b[m][2] = _mm512_fmadd_ps(r2, xl, b[m][2]);
        b[m][3] = _mm512_fmadd_ps(r3, xl, b[m][3]);
      }
    }
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < 4; ++j) a[m][j] = _mm512_add_ps(a[m][j], b[m][j]);
    // scales_zeros[g, n0 + 16j .. +16, 0..1]: 16 (scale, zero) bf16 pairs = 16 dwords.
    const at::BFloat16* s = sz + (g * n_total + n0) * 2;
    for (int j = 0; j < 4; ++j) {
      __m512 scale, zero;
      load_scale_zero(s + j * 32, &scale, &zero);
      for (int m = 0; m < M; ++m) {
        o[m][j] = _mm512_fmadd_ps(a[m][j], scale, o[m][j]);
        o[m][j] = _mm512_fmadd_ps(zero, _mm512_set1_ps(xsum[m * G + g]), o[m][j]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < 4; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * ldo + n0 + 16 * j),
                          fp32x16_to_bf16(o[m][j]));
}

using BlockFn = void (*)(const uint8_t*, const at::BFloat16*, int64_t, int64_t, int64_t, int64_t,
                         const float*, const float*, at::BFloat16*, int64_t);
constexpr BlockFn kBlocks[kRows] = {block<1>, block<2>, block<3>, block<4>};

// ---- The same block with bf16 dot products (AVX512_BF16 + AVX512_VBMI) -------------------
//
// Per two k (64 bytes), the fp32 kernel spends 24 vector instructions; this one 12. vpermb
// first moves the bytes of k and k + 1 that hold the same rows next to each other: dword d =
// (byte 2d, byte 2d+1 of k; byte 2d, byte 2d+1 of k+1). Each of the 4 nibbles of a 16-bit word
// is then looked up in a 32-entry bf16 table (vpermw reads the low 5 bits, so the table holds
// q - 8 twice), which leaves every dword holding the same row's code at k and at k + 1, and
// vdpbf16ps multiplies that pair by (x[k], x[k+1]) and adds both products into an fp32 lane.
// bf16 x bf16 products are exact in fp32. Nibble i of dword d is row 2d (i = 0), 2d + 32
// (i = 1), 2d + 1 (i = 2) or 2d + 33 (i = 3); scales are gathered in that order per group and
// the sums are put back in row order once, at the end.

#define OMNI_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16,avx512vbmi")))

OMNI_DOT_TARGET inline __m512i dot_code_table() {
  alignas(64) static const uint16_t table[32] = {
      0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,  // -8 .. -1
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,  //  0 ..  7
      0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
      0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
  return _mm512_load_si512(table);
}

OMNI_DOT_TARGET inline __m512i pair_bytes_index() {
  alignas(64) static const uint8_t index[64] = {
      0,  1,  32, 33, 2,  3,  34, 35, 4,  5,  36, 37, 6,  7,  38, 39,
      8,  9,  40, 41, 10, 11, 42, 43, 12, 13, 44, 45, 14, 15, 46, 47,
      16, 17, 48, 49, 18, 19, 50, 51, 20, 21, 52, 53, 22, 23, 54, 55,
      24, 25, 56, 57, 26, 27, 58, 59, 28, 29, 60, 61, 30, 31, 62, 63};
  return _mm512_load_si512(index);
}

template <int M>
OMNI_DOT_TARGET void block_dot(const uint8_t* w, const at::BFloat16* sz, int64_t n_total,
                               int64_t n0, int64_t K, int64_t gs, const at::BFloat16* xb,
                               const float* xsum, at::BFloat16* out, int64_t ldo) {
  const __m512i lut = dot_code_table();
  const __m512i pairs = pair_bytes_index();
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                         30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const int64_t G = K / gs;
  // o[m][i]: accumulators in nibble order (rows 2d, 2d + 32, 2d + 1, 2d + 33 for lane d)
  __m512 o[M][4];
  zero(&o);
  for (int64_t g = 0; g < G; ++g) {
    __m512 a[M][4];
    zero(&a);
    const uint8_t* p = w + g * gs * 32;
    const at::BFloat16* xg = xb + g * gs;
    for (int64_t k = 0; k < gs; k += 2, p += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(p) + 4096, _MM_HINT_T1);
      const __m512i v = _mm512_permutexvar_epi8(pairs, _mm512_loadu_si512(p));
      const __m512i q[4] = {
          _mm512_permutexvar_epi16(v, lut),
          _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), lut),
          _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), lut),
          _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), lut)};
      for (int m = 0; m < M; ++m) {
        int32_t xpair;
        std::memcpy(&xpair, xg + m * K + k, sizeof(xpair));
        const __m512bh xk = (__m512bh)_mm512_set1_epi32(xpair);
        for (int i = 0; i < 4; ++i) a[m][i] = _mm512_dpbf16_ps(a[m][i], (__m512bh)q[i], xk);
      }
    }
    // (scale, zero) pairs of rows 0..15, 16..31, 32..47, 48..63, then regrouped by nibble.
    const at::BFloat16* s = sz + (g * n_total + n0) * 2;
    __m512i raw[4];
    for (int j = 0; j < 4; ++j) raw[j] = _mm512_loadu_si512(s + j * 32);
    const __m512i by_nibble[4] = {_mm512_permutex2var_epi32(raw[0], even, raw[1]),
                                  _mm512_permutex2var_epi32(raw[2], even, raw[3]),
                                  _mm512_permutex2var_epi32(raw[0], odd, raw[1]),
                                  _mm512_permutex2var_epi32(raw[2], odd, raw[3])};
    for (int i = 0; i < 4; ++i) {
      const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(by_nibble[i], 16));
      const __m512 zero = _mm512_castsi512_ps(
          _mm512_and_si512(by_nibble[i], _mm512_set1_epi32(0xFFFF0000)));
      for (int m = 0; m < M; ++m) {
        o[m][i] = _mm512_fmadd_ps(a[m][i], scale, o[m][i]);
        o[m][i] = _mm512_fmadd_ps(zero, _mm512_set1_ps(xsum[m * G + g]), o[m][i]);
      }
    }
  }
  // Back to row order: rows 0..31 interleave o[0] (even) and o[2] (odd), rows 32..63 o[1], o[3].
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  for (int m = 0; m < M; ++m) {
    const __m512 rows[4] = {_mm512_permutex2var_ps(o[m][0], lo, o[m][2]),
                            _mm512_permutex2var_ps(o[m][0], hi, o[m][2]),
                            _mm512_permutex2var_ps(o[m][1], lo, o[m][3]),
                            _mm512_permutex2var_ps(o[m][1], hi, o[m][3])};
    for (int j = 0; j < 4; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * ldo + n0 + 16 * j),
                          fp32x16_to_bf16(rows[j]));
  }
}

using DotFn = void (*)(const uint8_t*, const at::BFloat16*, int64_t, int64_t, int64_t, int64_t,
                       const at::BFloat16*, const float*, at::BFloat16*, int64_t);
constexpr DotFn kDots[kRows] = {block_dot<1>, block_dot<2>, block_dot<3>, block_dot<4>};

bool cpu_has_dot() {
  static const bool has = __builtin_cpu_supports("avx512bf16") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has;
}

// Sums of x (bf16, K) over each group of `gs` (a multiple of 16), 16 lanes at a time; also x in
// fp32 into xf unless it is null. A scalar loop here was one serial chain of K dependent adds:
// about 8 us for K = 4864, 7 % of that layer's GEMV.
void group_sums(const at::BFloat16* x, int64_t K, int64_t gs, float* sums, float* xf) {
  for (int64_t g = 0; g < K / gs; ++g) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + k))),
          16));
      if (xf) _mm512_storeu_ps(xf + k, v);
      acc = _mm512_add_ps(acc, v);
    }
    sums[g] = _mm512_reduce_add_ps(acc);
  }
}

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed,
                     const at::Tensor& scales_zeros, int64_t group_size, bool bf16_dot) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x: bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = scales_zeros.size(1);
  const int64_t G = scales_zeros.size(0);
  check_pack(packed, scales_zeros, K, group_size);
  // x's per-group sums (and x in fp32, which only the fp32 loop reads), once, before the
  // threads start.
  const bool dot = bf16_dot && cpu_has_dot();
  std::vector<float> xbuf((dot ? 0 : M * K) + M * G);
  float* xp = dot ? nullptr : xbuf.data();
  float* xs = xbuf.data() + (dot ? 0 : M * K);
  const at::Tensor xc = x.contiguous();
  const at::BFloat16* xin = xc.data_ptr<at::BFloat16>();
  for (int64_t m = 0; m < M; ++m)
    group_sums(xin + m * K, K, group_size, xs + m * G, xp ? xp + m * K : nullptr);
  at::Tensor out = at::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t blocks = N / kBlockN;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* wb = w + b * kBlockN * K / 2;
      for (int64_t m0 = 0; m0 < M; m0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, M - m0));
        if (dot)
          kDots[rows - 1](wb, sz, N, b * kBlockN, K, group_size, xin + m0 * K, xs + m0 * G,
                          op + m0 * N, N);
        else
          kBlocks[rows - 1](wb, sz, N, b * kBlockN, K, group_size, xp + m0 * K, xs + m0 * G,
                            op + m0 * N, N);
      }
    }
  });
  return out;
}

at::Tensor int4_dequant_t(const at::Tensor& packed, const at::Tensor& scales_zeros,
                          int64_t group_size, int64_t n_begin, int64_t n_end) {
  const int64_t N = scales_zeros.size(1);
  const int64_t G = scales_zeros.size(0);
  const int64_t K = G * group_size;
  check_pack(packed, scales_zeros, K, group_size);
  TORCH_CHECK(0 <= n_begin && n_begin <= n_end && n_end <= N && n_begin % kBlockN == 0 &&
                  n_end % kBlockN == 0,
              "n_begin, n_end: multiples of 64 within [0, N]");
  const int64_t width = n_end - n_begin;
  at::Tensor wt = at::empty({K, width}, scales_zeros.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* dst = wt.data_ptr<at::BFloat16>();
  const __m512 lut = code_table();
  // One task per (group, block): it writes K/G rows of 64 contiguous bf16 each.
  const int64_t blocks = width / kBlockN;
  at::parallel_for(0, G * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = t / blocks, n0 = n_begin + (t % blocks) * kBlockN;
      __m512 scale[4], zero[4];
      for (int j = 0; j < 4; ++j)
        load_scale_zero(sz + (g * N + n0 + 16 * j) * 2, &scale[j], &zero[j]);
      const uint8_t* p = w + n0 * K / 2 + g * group_size * 32;
      at::BFloat16* out = dst + g * group_size * width + (n0 - n_begin);
      for (int64_t k = 0; k < group_size; ++k, p += 32, out += width) {
        __m512i d0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
        __m512i d1 =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)));
        const __m512 q[4] = {_mm512_permutexvar_ps(d0, lut), _mm512_permutexvar_ps(d1, lut),
                             _mm512_permutexvar_ps(_mm512_srli_epi32(d0, 4), lut),
                             _mm512_permutexvar_ps(_mm512_srli_epi32(d1, 4), lut)};
        for (int j = 0; j < 4; ++j)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * j),
                              fp32x16_to_bf16(_mm512_fmadd_ps(q[j], scale[j], zero[j])));
      }
    }
  });
  return wt;
}

// ---- The kernels of the vllm_omni ops themselves -----------------------------------------
//
// vllm_omni::cpu_int4_linear and cpu_int4_embedding are defined (schema and fake) in Python,
// vllm_omni/ops/int4_linear.py, which also holds their Python implementations. When this
// library loads, Python asks it (register_kernels) to be their CPU kernels instead: a decode step
// calls the linear about a hundred times, and the Python body cost about 8 us per call, more than
// the GEMV itself takes for a small weight. Same branches and same values as the Python ones.

// Rows of W^T dequantized at once on the many-row path: whole blocks, about 64 MiB of fp32-sized
// values (int4_pack.chunk_rows with REPACK_CHUNK_BYTES).
int64_t chunk_rows(int64_t K) {
  const int64_t rows = ((int64_t{64} << 20) / std::max<int64_t>(1, 4 * K)) / kBlockN * kBlockN;
  return std::max<int64_t>(kBlockN, rows);
}

at::Tensor cpu_int4_linear(const at::Tensor& x, const at::Tensor& packed,
                           const at::Tensor& scales_zeros, int64_t group_size,
                           int64_t row_threshold, const std::optional<at::Tensor>& bias) {
  const int64_t K = x.size(-1), N = scales_zeros.size(1);
  at::Tensor x2 = x.reshape({-1, K});
  if (x2.scalar_type() != at::kBFloat16) x2 = x2.to(at::kBFloat16);
  x2 = x2.contiguous();
  const int64_t rows = x2.size(0);
  at::Tensor y;
  if (N % kBlockN != 0) {
    // A partial last block: torch's kernel reads it (rare: N is a multiple of 16 only).
    y = at::_weight_int4pack_mm_for_cpu(x2, packed, group_size, scales_zeros);
  } else if (rows < row_threshold) {
    y = int4_gemv(x2, packed, scales_zeros, group_size, true);
  } else {
    const int64_t step = chunk_rows(K);
    if (step >= N) {
      y = at::mm(x2, int4_dequant_t(packed, scales_zeros, group_size, 0, N));
    } else {
      y = at::empty({rows, N}, x2.options());
      for (int64_t r = 0; r < N; r += step) {
        const int64_t end = std::min(N, r + step);
        y.narrow(1, r, end - r).copy_(
            at::mm(x2, int4_dequant_t(packed, scales_zeros, group_size, r, end)));
      }
    }
  }
  if (bias.has_value()) y = y + bias->to(y.scalar_type());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(N);
  return y.view(shape).to(x.scalar_type());
}

// Rows `ids` of the weight, dequantized: ids [...] -> bf16 [..., K]. Full blocks use the
// AVX-512 arrangement; a partial last block packs two consecutive rows per byte (int4_pack.py).
at::Tensor cpu_int4_embedding(const at::Tensor& ids, const at::Tensor& packed,
                              const at::Tensor& scales_zeros, int64_t K) {
  const int64_t N = scales_zeros.size(1), G = scales_zeros.size(0);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == N * K / 2 && scales_zeros.is_contiguous() &&
                  scales_zeros.scalar_type() == at::kBFloat16 && K % G == 0,
              "cpu_int4_embedding: packed uint8 [N, K/2], scales_zeros bf16 [G, N, 2]");
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t T = flat.numel(), gs = K / G, full = N / kBlockN * kBlockN;
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(K);
  at::Tensor out = at::empty(shape, scales_zeros.options());
  const int64_t* id = flat.data_ptr<int64_t>();
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* dst = out.data_ptr<at::BFloat16>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(0 <= id[t] && id[t] < N, "cpu_int4_embedding: id ", id[t], " out of [0, ", N, ")");
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = id[t];
      const uint8_t* p;
      int64_t stride, shift;
      if (n < full) {  // byte k * 32 + (n % 32) of its block, high nibble for n % 64 >= 32
        const int64_t local = n % kBlockN;
        p = w + (n - local) * K / 2 + local % 32;
        stride = 32;
        shift = local >= 32 ? 4 : 0;
      } else {  // byte k * width/2 + local/2 of the tail, high nibble for odd local
        const int64_t local = n - full, width = N - full;
        p = w + full * K / 2 + local / 2;
        stride = width / 2;
        shift = (local % 2) * 4;
      }
      at::BFloat16* o = dst + t * K;
      for (int64_t g = 0; g < G; ++g) {
        const float scale = static_cast<float>(sz[(g * N + n) * 2]);
        const float zero = static_cast<float>(sz[(g * N + n) * 2 + 1]);
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
          const int q = (p[k * stride] >> shift) & 0x0F;
          o[k] = at::BFloat16(std::fma(static_cast<float>(q - 8), scale, zero));
        }
      }
    }
  });
  return out;
}

// Makes this library the CPU kernels of the two vllm_omni ops (their schemas must be defined).
void register_kernels() {
  static torch::Library* lib = [] {
    auto* l = new torch::Library(torch::Library::IMPL, "vllm_omni", c10::DispatchKey::CPU,
                                 __FILE__, __LINE__);
    l->impl("cpu_int4_linear", TORCH_FN(cpu_int4_linear));
    l->impl("cpu_int4_embedding", TORCH_FN(cpu_int4_embedding));
    return l;
  }();
  (void)lib;
}

}  // namespace

TORCH_LIBRARY(vllm_omni_C, m) {
  m.def(
      "int4_gemv(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, "
      "bool bf16_dot=True) -> Tensor");
  m.def(
      "int4_dequant_t(Tensor packed, Tensor scales_zeros, int group_size, int n_begin, "
      "int n_end) -> Tensor");
  m.def("register_kernels() -> ()", &register_kernels);
}

TORCH_LIBRARY_IMPL(vllm_omni_C, CPU, m) {
  m.impl("int4_gemv", &int4_gemv);
  m.impl("int4_dequant_t", &int4_dequant_t);
}
