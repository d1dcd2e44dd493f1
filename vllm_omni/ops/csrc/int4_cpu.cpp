// Native kernels for cpu_int4 on torch's CPU int4 pack (AVX-512 builds of torch).
//
// The pack is the one torch.ops.aten._convert_weight_to_int4pack_for_cpu makes on AVX-512
// builds (see vllm_omni/ops/int4_pack.py): blocks of 64 output rows, k-major inside a block,
// 32 bytes per k: byte j holds row j's code in its low nibble and row j + 32's in its high one.
// scales_zeros is bf16 [G, N, 2] (scale, zero); w = (q - 8) * scale + zero.
//
// vllm_omni_C::int4_gemv(x, packed, scales_zeros, group_size, vnni=True): y = x @ W^T for a
//   few rows. Why not torch's _weight_int4pack_mm_for_cpu: it applies scale and zero to every
//   weight and streams a 0.5B model's int4 weights at about 12.5 GB/s on two cores of this
//   machine. Here the sum over a group is taken on (q - 8) alone, and scale and zero are applied
//   once per group:
//     y[n] = sum_g scale[g,n] * sum_{k in g} (q[n,k] - 8) x[k] + zero[g,n] * sum_{k in g} x[k].
//   Two inner loops compute the group sums. With AVX512_VNNI and AVX512_VBMI (and vnni), x
//   enters as 15-bit fixed point per group (rounding at most 2^-15 of the group's largest |x|)
//   and vpdpbusd takes 4 k of 16 rows per instruction on the codes as they are (block_vnni);
//   otherwise codes become fp32 through a table (vpermps) and fp32 FMAs take one k (block,
//   exact products, fp32 sums). The weights are prefetched 4 KiB ahead into L2. The VNNI loop
//   can prefetch non-temporally instead (set_weight_prefetch("nta")); measured side by side
//   in one process it was slower, 8-10 % on the weight stream and ~5 % a decode step.
//
// vllm_omni_C::int4_dequant_t(packed, scales_zeros, group_size, n_begin, n_end): the bf16
//   W^T [K, n_end - n_begin] of those output rows, for the many-row path (a bf16 matmul then
//   runs on it). Same values as vllm_omni.ops.int4_pack.dequantize_t: (q - 8) * scale is exact
//   in fp32, adding zero rounds once, and the result is rounded to nearest even bf16.
//
// Only full 64-row blocks are handled; the caller checks N % 64 == 0 (and the layout).
//
// vllm_omni_C::greedy_argmax(logits): per row of a 2-D bf16 or fp32 tensor, the index of the
//   first largest value as int64; an empty tensor if any row holds a NaN (the caller then takes
//   vLLM's own path for that step). Why: torch's argmax (and vLLM's _C::greedy_argmax) compare one
//   value at a time; this takes 16 per instruction, a pass for the maximum and one for the
//   first index that holds it. Used by the step_overhead patch's greedy sampler.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
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

// ---- The same block with int16 activations and u8 x s8 dot products (AVX512_VNNI + VBMI) --
//
// The fp32 loop spends 24 vector instructions per two k; a bf16 dot product loop (codes looked
// up as bf16, vdpbf16ps) still 12, and streamed at ~16.5 GB/s on two cores where memory gives
// ~23. vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds them into an int32
// lane: 64 multiply-adds per instruction, and the codes q = 0..15 are already unsigned bytes.
//
// x goes in as 15-bit fixed point per group: c = round(x / step), step = max|x| / 16383, split
// into two signed bytes c = 128 * hi + lo (hi in -128..127, lo in 0..127), and each group's
// integer sum sum_k q * c = 128 * sum q * hi + sum q * lo is exact in int32. The only rounding
// is c's: at most step / 2 = 2^-15 of the group's largest |x|, 64 times below bf16's own
// rounding of that element. The zero term uses the exact fp32 sum of x.
//
// vpermt2b gathers, from 4 k (two 64-byte rows pairs), dword n = the bytes of k..k+3 that hold
// rows n and n + 32: its low nibbles are row n's codes, its high ones row n + 32's. Two
// permutes cover the block's 64 rows in row order.

#define OMNI_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vbmi")))

constexpr int kVnniRows = 2;  // 8 accumulators per row of x: two rows fill the registers
constexpr int kFixedMax = 16383;

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

// One row of x (bf16, K) as fixed point per group of `gs`: hi, lo (K bytes each), step and the
// code sum per group, and the fp32 sum of x per group.
OMNI_VNNI_TARGET void fixed_point(const at::BFloat16* x, int64_t K, int64_t gs, int8_t* hi,
                                  int8_t* lo, float* step, int32_t* csum, float* xsum) {
  const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
  for (int64_t g = 0; g < K / gs; ++g) {
    __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      const __m512 v = bf16x16_to_fp32(x + k);
      amax = _mm512_max_ps(amax, _mm512_and_ps(v, sign));
      sum = _mm512_add_ps(sum, v);
    }
    const float top = _mm512_reduce_max_ps(amax);
    xsum[g] = _mm512_reduce_add_ps(sum);
    step[g] = top / kFixedMax;
    const __m512 inv = _mm512_set1_ps(top > 0 ? kFixedMax / top : 0.0f);
    const __m512i bound = _mm512_set1_epi32(kFixedMax);
    __m512i codes = _mm512_setzero_si512();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(bf16x16_to_fp32(x + k), inv));
      c = _mm512_max_epi32(_mm512_min_epi32(c, bound), _mm512_sub_epi32(_mm512_setzero_si512(),
                                                                        bound));
      codes = _mm512_add_epi32(codes, c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + k),
                       _mm512_cvtepi32_epi8(_mm512_srai_epi32(c, 7)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + k),
                       _mm512_cvtepi32_epi8(_mm512_and_si512(c, _mm512_set1_epi32(127))));
    }
    csum[g] = _mm512_reduce_add_epi32(codes);
  }
}

// x of M rows in fixed point, laid out as block_vnni reads it.
struct FixedX {
  std::vector<int8_t> hi, lo;
  std::vector<float> step, xsum;
  std::vector<int32_t> csum;
};

template <int M, int Hint>
OMNI_VNNI_TARGET void block_vnni(const uint8_t* w, const at::BFloat16* sz, int64_t n_total,
                                 int64_t n0, int64_t K, int64_t gs, const FixedX& fx, int64_t m0,
                                 at::BFloat16* out, int64_t ldo) {
  const __m512i index_lo = _mm512_load_si512(kRowsLo.bytes);
  const __m512i index_hi = _mm512_load_si512(kRowsHi.bytes);
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const int64_t G = K / gs;
  __m512 o[M][4];
  zero(&o);
  for (int64_t g = 0; g < G; ++g) {
    __m512i ah[M][4], al[M][4];  // sum q * hi and sum q * lo, rows 16i .. 16i + 15
    for (int m = 0; m < M; ++m)
      for (int i = 0; i < 4; ++i) ah[m][i] = al[m][i] = _mm512_setzero_si512();
    const uint8_t* p = w + g * gs * 32;
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 4, p += 128) {
      _mm_prefetch(reinterpret_cast<const char*>(p) + 4096, static_cast<_mm_hint>(Hint));
      _mm_prefetch(reinterpret_cast<const char*>(p) + 4096 + 64, static_cast<_mm_hint>(Hint));
      const __m512i a = _mm512_loadu_si512(p), b = _mm512_loadu_si512(p + 64);
      const __m512i rows_lo = _mm512_permutex2var_epi8(a, index_lo, b);  // rows 0..15 | 32..47
      const __m512i rows_hi = _mm512_permutex2var_epi8(a, index_hi, b);  // 16..31 | 48..63
      const __m512i q[4] = {_mm512_and_si512(rows_lo, nibble), _mm512_and_si512(rows_hi, nibble),
                            _mm512_and_si512(_mm512_srli_epi16(rows_lo, 4), nibble),
                            _mm512_and_si512(_mm512_srli_epi16(rows_hi, 4), nibble)};
      for (int m = 0; m < M; ++m) {
        int32_t h, l;
        std::memcpy(&h, fx.hi.data() + (m0 + m) * K + k, sizeof(h));
        std::memcpy(&l, fx.lo.data() + (m0 + m) * K + k, sizeof(l));
        const __m512i xh = _mm512_set1_epi32(h), xl = _mm512_set1_epi32(l);
        for (int i = 0; i < 4; ++i) {
          ah[m][i] = _mm512_dpbusd_epi32(ah[m][i], q[i], xh);
          al[m][i] = _mm512_dpbusd_epi32(al[m][i], q[i], xl);
        }
      }
    }
    // sum (q - 8) * c = 128 * sum q * hi + sum q * lo - 8 * sum c, then scale and zero.
    const at::BFloat16* s = sz + (g * n_total + n0) * 2;
    for (int i = 0; i < 4; ++i) {
      __m512 scale, zero;
      load_scale_zero(s + i * 32, &scale, &zero);
      for (int m = 0; m < M; ++m) {
        const int64_t mg = (m0 + m) * G + g;
        const __m512i dot = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_slli_epi32(ah[m][i], 7), al[m][i]),
            _mm512_set1_epi32(8 * fx.csum[mg]));
        o[m][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                  _mm512_mul_ps(scale, _mm512_set1_ps(fx.step[mg])), o[m][i]);
        o[m][i] = _mm512_fmadd_ps(zero, _mm512_set1_ps(fx.xsum[mg]), o[m][i]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < 4; ++i)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * ldo + n0 + 16 * i),
                          fp32x16_to_bf16(o[m][i]));
}

using VnniFn = void (*)(const uint8_t*, const at::BFloat16*, int64_t, int64_t, int64_t, int64_t,
                        const FixedX&, int64_t, at::BFloat16*, int64_t);
// [non-temporal][rows - 1]: see set_weight_prefetch.
constexpr VnniFn kVnnis[2][kVnniRows] = {{block_vnni<1, _MM_HINT_T1>, block_vnni<2, _MM_HINT_T1>},
                                         {block_vnni<1, _MM_HINT_NTA>, block_vnni<2, _MM_HINT_NTA>}};

// How the VNNI loop prefetches weights: "l2" (default) or "nta". A process-wide switch so that a
// benchmark can compare the two side by side in one process; returns the previous mode.
std::atomic<bool> g_prefetch_nta{false};

std::string set_weight_prefetch(const std::string& mode) {
  TORCH_CHECK(mode == "nta" || mode == "l2", "set_weight_prefetch: mode must be 'nta' or 'l2', got '",
              mode, "'");
  return g_prefetch_nta.exchange(mode == "nta") ? "nta" : "l2";
}

bool cpu_has_vnni() {
  static const bool has = __builtin_cpu_supports("avx512vnni") &&
                          __builtin_cpu_supports("avx512vbmi");
  return has;
}

// Sums of x (bf16, K) over each group of `gs` (a multiple of 16), 16 lanes at a time, and x in
// fp32 into xf. A scalar loop here was one serial chain of K dependent adds:
// about 8 us for K = 4864, 7 % of that layer's GEMV.
void group_sums(const at::BFloat16* x, int64_t K, int64_t gs, float* sums, float* xf) {
  for (int64_t g = 0; g < K / gs; ++g) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = g * gs; k < (g + 1) * gs; k += 16) {
      const __m512 v = bf16x16_to_fp32(x + k);
      _mm512_storeu_ps(xf + k, v);
      acc = _mm512_add_ps(acc, v);
    }
    sums[g] = _mm512_reduce_add_ps(acc);
  }
}

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed,
                     const at::Tensor& scales_zeros, int64_t group_size, bool vnni) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x: bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = scales_zeros.size(1);
  const int64_t G = scales_zeros.size(0);
  check_pack(packed, scales_zeros, K, group_size);
  const at::Tensor xc = x.contiguous();
  const at::BFloat16* xin = xc.data_ptr<at::BFloat16>();
  // x prepared once, before the threads start: in fixed point for the VNNI loop, in fp32 with
  // its per-group sums for the fp32 loop.
  const bool use_vnni = vnni && cpu_has_vnni();
  FixedX fx;
  std::vector<float> xf, xs;
  if (use_vnni) {
    fx.hi.resize(M * K), fx.lo.resize(M * K), fx.step.resize(M * G), fx.xsum.resize(M * G),
        fx.csum.resize(M * G);
    for (int64_t m = 0; m < M; ++m)
      fixed_point(xin + m * K, K, group_size, fx.hi.data() + m * K, fx.lo.data() + m * K,
                  fx.step.data() + m * G, fx.csum.data() + m * G, fx.xsum.data() + m * G);
  } else {
    xf.resize(M * K), xs.resize(M * G);
    for (int64_t m = 0; m < M; ++m)
      group_sums(xin + m * K, K, group_size, xs.data() + m * G, xf.data() + m * K);
  }
  at::Tensor out = at::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t blocks = N / kBlockN;
  const int64_t step = use_vnni ? kVnniRows : kRows;
  const VnniFn* vnnis = kVnnis[g_prefetch_nta.load(std::memory_order_relaxed) ? 1 : 0];
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* wb = w + b * kBlockN * K / 2;
      for (int64_t m0 = 0; m0 < M; m0 += step) {
        const int rows = static_cast<int>(std::min<int64_t>(step, M - m0));
        if (use_vnni)
          vnnis[rows - 1](wb, sz, N, b * kBlockN, K, group_size, fx, m0, op + m0 * N, N);
        else
          kBlocks[rows - 1](wb, sz, N, b * kBlockN, K, group_size, xf.data() + m0 * K,
                            xs.data() + m0 * G, op + m0 * N, N);
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

// Widens 16 bf16 to fp32 (exact: bf16 is the top half of an fp32).
inline __m512 load16(const at::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16_masked(const at::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load16_masked(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }

template <typename T>
int64_t row_argmax(const T* row, int64_t n) {
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
    const __m512 v = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), tail, load16_masked(row + i, tail));
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

at::Tensor greedy_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "greedy_argmax: logits must be 2-D [rows, vocab]");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat,
              "greedy_argmax: logits must be bf16 or fp32, got ", logits.scalar_type());
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    o[r] = x.scalar_type() == at::kFloat ? row_argmax(x.data_ptr<float>() + r * n, n)
                                         : row_argmax(x.data_ptr<at::BFloat16>() + r * n, n);
    if (o[r] < 0) return at::empty({0}, out.options());  // a NaN
  }
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
      "bool vnni=True) -> Tensor");
  m.def(
      "int4_dequant_t(Tensor packed, Tensor scales_zeros, int group_size, int n_begin, "
      "int n_end) -> Tensor");
  m.def("register_kernels() -> ()", &register_kernels);
  m.def("set_weight_prefetch(str mode) -> str", &set_weight_prefetch);
  m.def("greedy_argmax(Tensor logits) -> Tensor");
}

TORCH_LIBRARY_IMPL(vllm_omni_C, CPU, m) {
  m.impl("int4_gemv", &int4_gemv);
  m.impl("int4_dequant_t", &int4_dequant_t);
  m.impl("greedy_argmax", &greedy_argmax);
}
