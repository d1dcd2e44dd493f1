// What every kernel set of cpu_int4 shares (int4_avx512.cpp, int4_avx2.cpp, int4_portable.cpp):
// the layout, the fixed-point form of x, and scalar kernels that any block width can use.
//
// The layout (vllm_omni/ops/int4_pack.py): a weight [N, K] of 4-bit codes in blocks of 64 output
// rows (the last block has N % 64 rows when N is not a multiple of 64), k-major inside a block:
// for a block of w rows, byte k * w/2 + j holds row j's code in its low nibble and row j + w/2's
// in its high one. scales_zeros is bf16 [G, N, 2] (scale, zero); w = (q - 8) * scale + zero.
//
// The GEMV's arithmetic is the same on every kernel set, so that all of them give the same bits:
//   x goes in as 15-bit fixed point per group: c = round(x / step), step = max|x| / 16383 (c in
//   -16383..16383, so c = 128 * hi + lo with hi in -128..127 and lo in 0..127). The integer sum
//   dot = sum_k q * c - 8 * sum_k c is exact, whatever the order; then, group after group,
//     y = fma(float(dot), scale * step, y);  y = fma(zero, xsum, y)
//   with xsum the fp32 sum of x over the group, taken in 16 lanes (lane l adds k = l mod 16 in
//   order) reduced as 8 + 8, 4 + 4, then (0 + 2) + (1 + 3): the order of AVX-512's
//   _mm512_reduce_add_ps, which every set reproduces. c's rounding is at most 2^-15 of the
//   group's largest |x|, 64 times below bf16's own rounding of that element.
// W4A8 (activation_bits 8, opt-in): x goes in as int8 per group instead, c = round(x * 127 /
//   max|x|) in -127..127, and is then written in the 15-bit form above as 128 * c (hi = c,
//   lo = 0) with step = max|x| / 16256 (127 * 128), so dot, its finishing and the bf16 output
//   are the 15-bit arithmetic applied to those codes: a 15-bit kernel computes W4A8 from them
//   unchanged (the portable set's do), and a kernel of 8-bit products only (avx512's vpdpbusd,
//   avx2's vpmaddubsw on c alone) gives the same bits, shifting its sum left by 7.
//   c's rounding is up to 2^-8 of the group's largest |x|: the accuracy that costs is measured
//   by the quality sweep (docs/quality.md), which is why it is not the default.
// The dequantization (prefill) is fma(q - 8, scale, zero) rounded to bf16, also the same bits
// on every set and in Python (the product is exact in fp32).
//
// Everything here is built with -ffp-contract=off, so no compiler fuses what is written apart.

#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace omni {

constexpr int kBlockN = 64;
constexpr int kFixedMax = 16383;
constexpr int kInt8Max = 127;
constexpr float kInt8Steps = 127.0f * 128.0f;  // W4A8's codes as 15-bit ones: 128 * c

// x of M rows in fixed point: hi, lo (K bytes per row), and per row and group the step, the
// code sum and the fp32 sum of x.
struct FixedX {
  std::vector<int8_t> hi, lo;
  std::vector<float> step, xsum;
  std::vector<int32_t> csum;
};

inline float bf16_to_float(at::BFloat16 v) { return static_cast<float>(v); }

// Round to nearest even, as torch's float -> bfloat16 conversion (no NaN reaches here).
inline at::BFloat16 to_bf16(float v) { return at::BFloat16(v); }

// The sum of 16 lane partial sums in the order of _mm512_reduce_add_ps.
inline float reduce16(const float* s) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = s[i + 8] + s[i];
  for (int i = 0; i < 4; ++i) u[i] = t[i + 4] + t[i];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// Scalar fixed_point: the definition the vector ones reproduce bit for bit. A8: W4A8's x (see the
// top of this file), c in -127..127 as hi with lo = 0, step and code sum those of 128 * c.
template <bool A8>
inline void fixed_point_scalar(const at::BFloat16* x, int64_t K, int64_t gs, int8_t* hi,
                               int8_t* lo, float* step, int32_t* csum, float* xsum) {
  constexpr int kMax = A8 ? kInt8Max : kFixedMax;
  constexpr float kSteps = A8 ? kInt8Steps : static_cast<float>(kFixedMax);
  for (int64_t g = 0; g < K / gs; ++g) {
    float amax = 0.0f, lanes[16] = {};
    for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
      const float v = bf16_to_float(x[k]);
      amax = std::max(amax, std::fabs(v));
      lanes[(k - g * gs) % 16] += v;
    }
    xsum[g] = reduce16(lanes);
    step[g] = amax / kSteps;
    const float inv = amax > 0 ? kMax / amax : 0.0f;
    int32_t codes = 0;
    for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
      int32_t c = static_cast<int32_t>(std::nearbyint(bf16_to_float(x[k]) * inv));
      c = std::min(kMax, std::max(-kMax, c));
      codes += c;
      hi[k] = static_cast<int8_t>(A8 ? c : c >> 7);
      lo[k] = static_cast<int8_t>(A8 ? 0 : c & 127);
    }
    csum[g] = A8 ? 128 * codes : codes;
  }
}

// The 64 (scale, zero) bf16 pairs of a full block's group (p: the first) as fp32 sc[j], ze[j].
inline void scales_zeros64(const at::BFloat16* p, float* sc, float* ze) {
  for (int j = 0; j < kBlockN; ++j)
    sc[j] = bf16_to_float(p[2 * j]), ze[j] = bf16_to_float(p[2 * j + 1]);
}

// The float finishing of one group for `n` rows: dot (exact ints) -> y.
inline void finish_group(const int32_t* dot, int64_t n, const at::BFloat16* sz, float step,
                         int32_t csum, float xsum, float* y) {
  for (int64_t j = 0; j < n; ++j) {
    const float scale = bf16_to_float(sz[2 * j]), zero = bf16_to_float(sz[2 * j + 1]);
    y[j] = std::fma(static_cast<float>(dot[j] - 8 * csum), scale * step, y[j]);
    y[j] = std::fma(zero, xsum, y[j]);
  }
}

// One block of `w` rows (w even, <= 64) for rows m0 .. m0 + rows - 1 of x: any kernel set's tail
// block, and every block of the portable set.
inline void block_scalar(int rows, const uint8_t* blk, int64_t w, const at::BFloat16* sz,
                         int64_t n_total, int64_t n0, int64_t K, int64_t gs, const FixedX& fx,
                         int64_t m0, at::BFloat16* out, int64_t ldo) {
  const int64_t G = K / gs, half = w / 2;
  for (int m = 0; m < rows; ++m) {
    const int8_t* hi = fx.hi.data() + (m0 + m) * K;
    const int8_t* lo = fx.lo.data() + (m0 + m) * K;
    float y[kBlockN] = {};
    for (int64_t g = 0; g < G; ++g) {
      int32_t dot[kBlockN] = {};
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
        const uint8_t* p = blk + k * half;
        const int32_t c = 128 * hi[k] + lo[k];
        for (int64_t j = 0; j < half; ++j) {
          dot[j] += (p[j] & 0x0F) * c;
          dot[j + half] += (p[j] >> 4) * c;
        }
      }
      const int64_t mg = (m0 + m) * G + g;
      finish_group(dot, w, sz + (g * n_total + n0) * 2, fx.step[mg], fx.csum[mg], fx.xsum[mg], y);
    }
    for (int64_t j = 0; j < w; ++j) out[(m0 + m) * ldo + n0 + j] = to_bf16(y[j]);
  }
}

// W^T rows of one group for a block of `w` rows: out[k][j] for k in the group, j < w.
inline void dequant_scalar(const uint8_t* blk, int64_t w, const at::BFloat16* sz_g, int64_t gs,
                           int64_t k0, at::BFloat16* out, int64_t ld) {
  const int64_t half = w / 2;
  for (int64_t k = k0; k < k0 + gs; ++k, out += ld) {
    const uint8_t* p = blk + k * half;
    for (int64_t j = 0; j < w; ++j) {
      const int q = j < half ? (p[j] & 0x0F) : (p[j - half] >> 4);
      out[j] = to_bf16(std::fma(static_cast<float>(q - 8), bf16_to_float(sz_g[2 * j]),
                                bf16_to_float(sz_g[2 * j + 1])));
    }
  }
}

// ---- The GEMM (many rows of x): the GEMV's integer dot products and float finishing, so a
// row's output has the same bits whichever op computes it and however many rows come along.
//
// Per block of 64 output rows and group, the codes are unpacked once into a small buffer that
// every row of x then reads: dword kp * 64 + j holds row j's codes of k = 2kp (low 16 bits) and
// 2kp + 1 (high 16 bits). x enters as the same pairs of its fixed-point codes c = 128 * hi + lo
// (int16 each), so one int16 x int16 multiply-add of pairs (vpdpwssd, vpmaddwd) gives
// q[2kp] * c[2kp] + q[2kp+1] * c[2kp+1]: the same exact integer sum the GEMV takes in two bytes.

// x's codes as pairs, c[m][2kp] (low 16 bits) | c[m][2kp + 1] (high 16 bits), for the rows of one
// tile interleaved: row r's pair kp at c2[kp * ld + r] (ld: the tile's rows), so a tile reads
// one stream, not one per row (measured on one core: the avx512 GEMM 6 % faster at 128 rows).
inline void code_pairs_row(const int8_t* hi, const int8_t* lo, int64_t K, int64_t ld, int32_t* c2) {
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    const int32_t c0 = 128 * hi[2 * kp] + lo[2 * kp], c1 = 128 * hi[2 * kp + 1] + lo[2 * kp + 1];
    c2[kp * ld] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(c0)) |
                                       (static_cast<uint32_t>(static_cast<uint16_t>(c1)) << 16));
  }
}

// One group of a full block, unpacked: p is the group's first byte (k = g * gs, even).
inline void unpack_scalar(const uint8_t* p, int64_t gs, int32_t* qb) {
  for (int64_t kp = 0; kp < gs / 2; ++kp, p += 64) {
    for (int j = 0; j < kBlockN; ++j) {
      const int a = j < 32 ? p[j] & 0x0F : p[j - 32] >> 4;
      const int b = j < 32 ? p[32 + j] & 0x0F : p[j] >> 4;  // p[32 + j - 32]
      qb[kp * kBlockN + j] = a | (b << 16);
    }
  }
}

// What a GEMM tile needs of one group: the unpacked codes, and the block's scales and zeros as
// fp32 (sc[j], ze[j] for the block's row j).
struct GemmGroup {
  const int32_t* qb;
  int64_t kpairs;  // dwords of codes per output row: gs / 2 (pairs), gs / 4 (W4A8's quads)
  const float* sc;
  const float* ze;
};

// Rows of x that a tile reads: its code pairs from the group's first (row r's pair kp at
// c2[kp * ldk + r], ldk the set's kTileRows) and its fixed-point step, code sum and fp32 sum for
// this group (row r at index r * ldm).
struct GemmRows {
  const int32_t* c2;
  int64_t ldk;
  const float* step;
  const int32_t* csum;
  const float* xsum;
  int64_t ldm;
};

// The float finishing of one group for one row of x and 64 outputs, as finish_group.
inline void finish64_scalar(const int32_t* dot, const GemmGroup& gg, float step, int32_t csum,
                            float xsum, float* o) {
  for (int j = 0; j < kBlockN; ++j) {
    o[j] = std::fma(static_cast<float>(dot[j] - 8 * csum), gg.sc[j] * step, o[j]);
    o[j] = std::fma(gg.ze[j], xsum, o[j]);
  }
}

// `rows` rows of x times one group of a full block, added into o (fp32 [rows][64]).
inline void tile_scalar(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  for (int r = 0; r < rows; ++r) {
    int32_t dot[kBlockN] = {};
    for (int64_t kp = 0; kp < gg.kpairs; ++kp) {
      const int32_t pair = x.c2[kp * x.ldk + r];
      const int32_t c0 = static_cast<int16_t>(pair & 0xFFFF), c1 = pair >> 16;
      const int32_t* q = gg.qb + kp * kBlockN;
      for (int j = 0; j < kBlockN; ++j) dot[j] += (q[j] & 0xFFFF) * c0 + (q[j] >> 16) * c1;
    }
    finish64_scalar(dot, gg, x.step[r * x.ldm], x.csum[r * x.ldm], x.xsum[r * x.ldm],
                    o + r * kBlockN);
  }
}

// Per row, the index of the first largest value; -1 if the row holds a NaN.
template <typename T>
int64_t argmax_scalar(const T* row, int64_t n) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t at = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(row[i]);
    if (std::isnan(v)) return -1;
    if (v > best) best = v, at = i;
  }
  return at;
}

}  // namespace omni
