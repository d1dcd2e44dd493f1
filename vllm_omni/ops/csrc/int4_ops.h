// The ops of one kernel set, included at the end of int4_avx512.cpp, int4_avx2.cpp and
// int4_portable.cpp after each has defined, in namespace omni::isa:
//   kName                       the set's name ("avx512", "avx2", "portable")
//   kRows                       rows of x per pass over a block
//   fixed_point<A8>(...)        omni::fixed_point_scalar<A8>'s bits (A8: W4A8's x), vectorised
//   block64<Hint>(rows, ...)    the GEMV of one full block of 64 rows (Hint: 0 = prefetch into
//                               L2, 1 = non-temporal; a set may ignore it)
//   kStreamBlocks               how many adjacent full blocks block64 (and block64_a8) read side
//                               by side for one row of x: they take rows = -B for B = 2 ..
//                               kStreamBlocks (1: the set reads one block at a time)
//   kGemvStreams                how many it reads at once by default (set_gemv_streams)
//   dequant64(...)              one group of W^T for one full block
//   kTileRows                   rows of x per GEMM tile
//   unpack64(p, gs, qb)         one group of a full block for the GEMM (omni::unpack_scalar's)
//   tile(rows, group, x, o)     the GEMM of rows <= kTileRows rows of x times one unpacked group,
//                               added into o (omni::tile_scalar's bits)
//   store64(o, out)             64 fp32 outputs rounded to bf16 (omni::to_bf16's bits)
//   argmax(row, n)              per row of bf16 / fp32 logits (see greedy_argmax)
// and OMNI_NS, the torch.ops namespace of this library (vllm_omni_<set>). Every set's library can
// be loaded into one process (each has its own namespace): tests compare them bit for bit.
// A set with kernels of 8-bit products for W4A8 defines OMNI_A8_KERNELS and
//   block64_a8<Hint>(...)        block64 for W4A8's x (reads hi only)
//   unpack64_quads(p, gs, qb)    one group of a full block as dwords of 4 codes: qb[kq * 64 + j]
//                                holds row j's codes of k = 4kq .. 4kq + 3, a byte each
//   tile8(rows, group, x, o)     the GEMM tile on those quads and x's int8 codes in quads
//                                (GemmRows::c2 then holds 4 codes of a row a dword)
// Without them W4A8 runs on the 15-bit kernels, whose arithmetic its codes are written in.
// The amx set (int4_avx512.cpp under OMNI_AMX) defines OMNI_AMX_KERNELS and
//   amx_ready(), amx_chunk(gs), amx_configure(kc), amx_release()   AMX's permission and tiles
//   amx_tiles_of_x(x, M, K, kc, xt)                                  x's codes as 1 KiB tiles
//   block_amx<A8>(...)            the GEMM of one full block for every row, on AMX tiles
// and its int4_gemm takes those instead of the tiles above wherever Linux grants AMX.
// The amx and avx512bf16 sets define OMNI_BF16_MM_KERNELS and the mm_* helpers of int4_tile_mm
//   kMmPanelN, kMmPanelK, kMmChunkRows, kMmRows   its panel, k-panel, rows a pass, row step
//   mm_ready(), mm_begin(), mm_end()   whether it can run here; a thread's set-up and release
//   mm_x(x, M, K, xt)                  x as mm_panel reads it (xt: storage it may fill)
//   mm_panel(...)                      up to 4 full blocks for every row of x
// (AMX-BF16 tiles in the amx set, AVX512_BF16 registers in the avx512bf16 set).
//
// OMNI_NS::int4_gemv(x, packed, scales_zeros, group_size, activation_bits=16): y = x @ W^T for
//   a few rows of x; activation_bits 8: W4A8 (int4_base.h).
// OMNI_NS::int4_gemm(x, packed, scales_zeros, group_size, activation_bits=16): y = x @ W^T for
//   many rows of x, with the GEMV's arithmetic: row r of y has the bits int4_gemv gives for
//   row r alone (at the same activation_bits).
// OMNI_NS::int4_dequant_t(packed, scales_zeros, group_size, n_begin, n_end): bf16 W^T
//   [K, n_end - n_begin] of those output rows (n_begin a multiple of 64, n_end too or N).
// OMNI_NS::int4_dequant_mm(x, packed, scales_zeros, group_size): y = x @ W^T as a bf16 matmul
//   on W^T dequantized chunk by chunk (what cpu_int4_linear runs from dequant_rows rows on in
//   the sets without int4_tile_mm).
// OMNI_NS::int4_tile_mm(x, packed, scales_zeros, group_size), the amx and avx512bf16 sets only:
//   the same product on AMX bf16 tiles or AVX512_BF16 registers, dequantized straight into the
//   layout they read (cpu_int4_linear's branch from dequant_rows rows on in those sets).
// OMNI_NS::greedy_argmax(logits): per row of a 2-D bf16 or fp32 tensor the index of the first
//   largest value as int64; an empty tensor if any row holds a NaN (the caller then takes vLLM's
//   own path for that step). Used by the step_overhead patch's greedy sampler.
// OMNI_NS::register_kernels(): makes this set's cpu_int4_linear / cpu_int4_embedding the CPU
//   kernels of the vllm_omni ops (defined in vllm_omni/ops/int4_linear.py); one set per process.
// OMNI_NS::set_weight_prefetch(mode): "l2" (default) or "nta", process-wide, for benchmarks.
// OMNI_NS::set_gemv_streams(n): 1 to 4 (default the set's kGemvStreams), process-wide, for
//   benchmarks: how many blocks the GEMV of one row of x reads at once, at most the set's
//   kStreamBlocks; returns the previous value. The bits do not depend on it.

#pragma once

#define OMNI_STR2(x) #x
#define OMNI_STR(x) OMNI_STR2(x)
#define OMNI_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define OMNI_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

namespace omni {
namespace {

std::atomic<bool> g_prefetch_nta{false};

std::string set_weight_prefetch(const std::string& mode) {
  TORCH_CHECK(mode == "nta" || mode == "l2",
              "set_weight_prefetch: mode must be 'nta' or 'l2', got '", mode, "'");
  return g_prefetch_nta.exchange(mode == "nta") ? "nta" : "l2";
}

std::atomic<int> g_gemv_streams{isa::kGemvStreams};

int64_t set_gemv_streams(int64_t n) {
  TORCH_CHECK(n >= 1 && n <= 4, "set_gemv_streams: n must be 1 to 4, got ", n);
  return g_gemv_streams.exchange(static_cast<int>(n));
}

std::string kernel_set() { return isa::kName; }

void check_pack(const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t K,
                int64_t group_size) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous(), "packed: uint8");
  TORCH_CHECK(scales_zeros.dim() == 3 && scales_zeros.size(2) == 2 &&
                  scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous(),
              "scales_zeros: bf16 [G, N, 2]");
  const int64_t N = scales_zeros.size(1);
  TORCH_CHECK(group_size > 0 && group_size % 16 == 0 && K == scales_zeros.size(0) * group_size,
              "K must be G * group_size, group_size a multiple of 16");
  TORCH_CHECK(N % 16 == 0, "N must be a multiple of 16");
  TORCH_CHECK(packed.numel() == N * K / 2, "packed must hold N * K / 2 bytes");
}

bool is_a8(int64_t activation_bits) {
  TORCH_CHECK(activation_bits == 16 || activation_bits == 8,
              "activation_bits must be 16 or 8, got ", activation_bits);
  return activation_bits == 8;
}

// Row m of x in fixed point (15-bit, or W4A8's codes).
inline void fixed_row(const at::BFloat16* xin, int64_t m, int64_t K, int64_t G, int64_t gs,
                      bool a8, FixedX& fx) {
  auto* f = a8 ? &isa::fixed_point<true> : &isa::fixed_point<false>;
  f(xin + m * K, K, gs, fx.hi.data() + m * K, fx.lo.data() + m * K, fx.step.data() + m * G,
    fx.csum.data() + m * G, fx.xsum.data() + m * G);
}

at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& packed,
                     const at::Tensor& scales_zeros, int64_t group_size,
                     int64_t activation_bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x: bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = scales_zeros.size(1);
  const int64_t G = scales_zeros.size(0);
  check_pack(packed, scales_zeros, K, group_size);
  const bool a8 = is_a8(activation_bits);
  const at::Tensor xc = x.contiguous();
  const at::BFloat16* xin = xc.data_ptr<at::BFloat16>();
  // x in fixed point once, before the threads start.
  FixedX fx;
  fx.hi.resize(M * K), fx.lo.resize(M * K), fx.step.resize(M * G), fx.xsum.resize(M * G),
      fx.csum.resize(M * G);
  for (int64_t m = 0; m < M; ++m) fixed_row(xin, m, K, G, group_size, a8, fx);
  at::Tensor out = at::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t full = N / kBlockN, tail = N % kBlockN;
  const bool nta = g_prefetch_nta.load(std::memory_order_relaxed);
  const int streams = g_gemv_streams.load(std::memory_order_relaxed);
  at::parallel_for(0, full + (tail ? 1 : 0), 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* wb = w + b * kBlockN * K / 2;
      // One row of x: up to kStreamBlocks blocks at once, as many weight streams.
      const int64_t together =
          M == 1 && b < full ? std::min<int64_t>({streams, isa::kStreamBlocks, b1 - b, full - b})
                             : 1;
      for (int64_t m0 = 0; m0 < M; m0 += isa::kRows) {
        const int rows = together > 1 ? -static_cast<int>(together)
                                      : static_cast<int>(std::min<int64_t>(isa::kRows, M - m0));
        if (b == full)
          block_scalar(rows, wb, tail, sz, N, b * kBlockN, K, group_size, fx, m0, op, N);
#ifdef OMNI_A8_KERNELS
        else if (a8 && nta)
          isa::block64_a8<1>(rows, wb, sz, N, b * kBlockN, K, group_size, fx, m0, op, N);
        else if (a8)
          isa::block64_a8<0>(rows, wb, sz, N, b * kBlockN, K, group_size, fx, m0, op, N);
#endif
        else if (nta)
          isa::block64<1>(rows, wb, sz, N, b * kBlockN, K, group_size, fx, m0, op, N);
        else
          isa::block64<0>(rows, wb, sz, N, b * kBlockN, K, group_size, fx, m0, op, N);
      }
      b += together - 1;
    }
  });
  return out;
}

// x in fixed point, rows spread over the threads.
FixedX fixed_x(const at::BFloat16* xin, int64_t M, int64_t K, int64_t G, int64_t gs, bool a8) {
  FixedX fx;
  fx.hi.resize(M * K), fx.lo.resize(M * K), fx.step.resize(M * G), fx.xsum.resize(M * G),
      fx.csum.resize(M * G);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) fixed_row(xin, m, K, G, gs, a8, fx);
  });
  return fx;
}

// At most this many rows of x per pass over a block's groups: their fp32 outputs (rows x 64)
// stay in L2. Whole tiles (256 rounded up), so that every pass starts at a tile of the
// interleaved code pairs and 512 rows take two passes.
constexpr int64_t kGemmChunkRows = (256 + isa::kTileRows - 1) / isa::kTileRows * isa::kTileRows;

// The rows of each pass: M in as few passes as kGemmChunkRows allows, of equal size (whole tiles).
// Every pass unpacks each group of the block again, so 512 rows as 252 + 252 + 8 paid a third
// unpacking of every group for 8 rows. (No rows: one empty pass.)
int64_t gemm_chunk_rows(int64_t M) {
  constexpr int64_t R = isa::kTileRows;
  const int64_t passes = std::max<int64_t>(1, (M + kGemmChunkRows - 1) / kGemmChunkRows);
  return ((M + passes - 1) / passes + R - 1) / R * R;
}

// Row m's W4A8 codes as quads, c4[kq * ld] = c[4kq .. 4kq + 3] (a byte each), as code_pairs_row.
inline void code_quads_row(const int8_t* c, int64_t K, int64_t ld, int32_t* c4) {
  for (int64_t kq = 0; kq < K / 4; ++kq) std::memcpy(c4 + kq * ld, c + 4 * kq, 4);
}

at::Tensor int4_gemm(const at::Tensor& x, const at::Tensor& packed,
                     const at::Tensor& scales_zeros, int64_t group_size,
                     int64_t activation_bits) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "x: bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = scales_zeros.size(1);
  const int64_t G = scales_zeros.size(0), gs = group_size;
  check_pack(packed, scales_zeros, K, group_size);
  const bool a8 = is_a8(activation_bits);
#ifdef OMNI_AMX_KERNELS
  // AMX tiles read x's codes laid out as tiles (xt_hi, xt_lo below) and the weight's in quads,
  // for W4A16 and W4A8 alike
  const bool amx = isa::amx_ready();
  const int amx_kc = isa::amx_chunk(gs);
#else
  constexpr bool amx = false;
#endif
#ifdef OMNI_A8_KERNELS
  const bool quads = a8;  // 8-bit products: 4 k a dword of codes and of x
#else
  const bool quads = false;
#endif
  const int64_t per = quads ? 4 : 2;  // k per dword
  const at::Tensor xc = x.contiguous();
  const FixedX fx = fixed_x(xc.data_ptr<at::BFloat16>(), M, K, G, gs, a8);
#ifdef OMNI_AMX_KERNELS
  // x's codes as AMX tiles (zeros past row M, up to a multiple of 32 rows)
  std::vector<int8_t> xt_hi(amx ? (M + 31) / 32 * 32 * K : 0), xt_lo(amx && !a8 ? xt_hi.size() : 0);
  if (amx) {
    at::parallel_for(0, (M + 15) / 16, 1, [&](int64_t t0, int64_t t1) {
      const int64_t m0 = t0 * 16, rows = std::min(M, t1 * 16) - m0;
      isa::amx_tiles_of_x(fx.hi.data() + m0 * K, rows, K, amx_kc, xt_hi.data() + m0 * K);
      if (!a8) isa::amx_tiles_of_x(fx.lo.data() + m0 * K, rows, K, amx_kc, xt_lo.data() + m0 * K);
    });
  }
#endif
  // x's codes, pairs or quads, tile by tile (the last tile's missing rows stay zero and are
  // never read); not for AMX
  constexpr int64_t R = isa::kTileRows;
  std::vector<int32_t> c2(amx ? 0 : (M + R - 1) / R * R * K / per);
  if (!amx) at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      int32_t* dst = c2.data() + m / R * R * K / per + m % R;
      if (quads)
        code_quads_row(fx.hi.data() + m * K, K, R, dst);
      else
        code_pairs_row(fx.hi.data() + m * K, fx.lo.data() + m * K, K, R, dst);
    }
  });
  at::Tensor out = at::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t full = N / kBlockN, tail = N % kBlockN;
  const int64_t chunk = gemm_chunk_rows(M);
  at::parallel_for(0, full + (tail ? 1 : 0), 1, [&](int64_t b0, int64_t b1) {
    // the tiles' codes (pairs: gs / 2 dwords a row; quads: half) and fp32 outputs; AMX has its own
    std::vector<int32_t> qb(amx ? 0 : gs / 2 * kBlockN);
    std::vector<float> o(amx ? 0 : std::min(M, chunk) * kBlockN);
    alignas(64) float sc[kBlockN], ze[kBlockN];
#ifdef OMNI_AMX_KERNELS
    isa::AmxScratch amx_scratch;
    if (amx) isa::amx_configure(amx_kc);
#endif
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlockN;
      const uint8_t* wb = w + n0 * K / 2;
      if (b == full) {  // the tail block: the GEMV's scalar kernel, row by row
        block_scalar(static_cast<int>(M), wb, tail, sz, N, n0, K, gs, fx, 0, op, N);
        continue;
      }
#ifdef OMNI_AMX_KERNELS
      if (amx) {  // every row, every group, on AMX tiles (int4_avx512.cpp)
        if (a8)
          isa::block_amx<true>(wb, sz + n0 * 2, N, K, gs, amx_kc, fx, xt_hi.data(), xt_lo.data(),
                               M, amx_scratch, op + n0, N);
        else
          isa::block_amx<false>(wb, sz + n0 * 2, N, K, gs, amx_kc, fx, xt_hi.data(), xt_lo.data(),
                                M, amx_scratch, op + n0, N);
        continue;
      }
#endif
      for (int64_t m0 = 0; m0 < M; m0 += chunk) {
        const int64_t rows = std::min(chunk, M - m0);
        std::fill(o.begin(), o.begin() + rows * kBlockN, 0.0f);
        for (int64_t g = 0; g < G; ++g) {
#ifdef OMNI_A8_KERNELS
          if (quads)
            isa::unpack64_quads(wb + g * gs * kBlockN / 2, gs, qb.data());
          else
#endif
            isa::unpack64(wb + g * gs * kBlockN / 2, gs, qb.data());
          scales_zeros64(sz + (g * N + n0) * 2, sc, ze);
          const GemmGroup gg{qb.data(), gs / per, sc, ze};
          for (int64_t t = 0; t < rows; t += isa::kTileRows) {
            const int64_t r = m0 + t;
            const GemmRows xr{c2.data() + r * K / per + g * gs / per * R, R,
                              fx.step.data() + r * G + g, fx.csum.data() + r * G + g,
                              fx.xsum.data() + r * G + g, G};
            const int tr = static_cast<int>(std::min<int64_t>(isa::kTileRows, rows - t));
#ifdef OMNI_A8_KERNELS
            if (quads) {
              isa::tile8(tr, gg, xr, o.data() + t * kBlockN);
              continue;
            }
#endif
            isa::tile(tr, gg, xr, o.data() + t * kBlockN);
          }
        }
        for (int64_t m = 0; m < rows; ++m)
          isa::store64(o.data() + m * kBlockN, op + (m0 + m) * N + n0);
      }
    }
#ifdef OMNI_AMX_KERNELS
    if (amx) isa::amx_release();
#endif
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
                  (n_end % kBlockN == 0 || n_end == N),
              "n_begin, n_end: multiples of 64 (n_end may be N) within [0, N]");
  const int64_t width = n_end - n_begin;
  at::Tensor wt = at::empty({K, width}, scales_zeros.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* dst = wt.data_ptr<at::BFloat16>();
  // One task per (group, block): it writes K/G rows of the block's columns.
  const int64_t blocks = (width + kBlockN - 1) / kBlockN;
  at::parallel_for(0, G * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t g = t / blocks, n0 = n_begin + (t % blocks) * kBlockN;
      const int64_t rows = std::min<int64_t>(kBlockN, N - n0);
      const uint8_t* blk = w + n0 * K / 2;
      const at::BFloat16* szg = sz + (g * N + n0) * 2;
      at::BFloat16* out = dst + g * group_size * width + (n0 - n_begin);
      if (rows == kBlockN)
        isa::dequant64(blk + g * group_size * kBlockN / 2, szg, group_size, out, width);
      else
        dequant_scalar(blk, rows, szg, group_size, g * group_size, out, width);
    }
  });
  return wt;
}

// y = x @ W^T the way vLLM's bf16 linear computes it, on W^T dequantized kDequantChunk output
// rows at a time (2 KiB of W^T a k, so a chunk stays in cache while it is multiplied) by torch's
// bf16 matmul (oneDNN; AMX tiles where the CPU has them). Not the GEMV's bits: W is rounded to
// bf16 (int4_pack.dequantize's values) and x enters as it is, not as 15-bit codes.
constexpr int64_t kDequantChunk = 256;

at::Tensor int4_dequant_mm(const at::Tensor& x, const at::Tensor& packed,
                           const at::Tensor& scales_zeros, int64_t group_size) {
  const int64_t N = scales_zeros.size(1);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "int4_dequant_mm: x must be bf16 [M, K]");
  if (N <= kDequantChunk) return at::mm(x, int4_dequant_t(packed, scales_zeros, group_size, 0, N));
  at::Tensor y = at::empty({x.size(0), N}, x.options());
  for (int64_t r = 0; r < N; r += kDequantChunk) {
    const int64_t end = std::min(N, r + kDequantChunk);
    const at::Tensor wt = int4_dequant_t(packed, scales_zeros, group_size, r, end);
    y.narrow(1, r, end - r).copy_(at::mm(x, wt));
  }
  return y;
}

#ifdef OMNI_BF16_MM_KERNELS
// y = x @ W^T as int4_dequant_mm computes it (the same bf16 weights, fp32 sums of bf16 products,
// rounded to bf16 once), on bf16 products fed by the dequantization itself (int4_avx512.cpp's
// mm_*: AMX-BF16 tiles in the amx set, AVX512_BF16 registers in the avx512bf16 set): W^T never
// goes to memory and no matmul is called per chunk. The sums' order is not oneDNN's, so not
// int4_dequant_mm's bits. Where Linux refuses AMX, K or the group is not a multiple of 32:
// int4_dequant_mm. A last block of fewer than 64 outputs: dequantized, torch.mm.
at::Tensor int4_tile_mm(const at::Tensor& x, const at::Tensor& packed,
                        const at::Tensor& scales_zeros, int64_t group_size) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16,
              "int4_tile_mm: x must be bf16 [M, K]");
  const int64_t M = x.size(0), K = x.size(1), N = scales_zeros.size(1);
  check_pack(packed, scales_zeros, K, group_size);
  if (!isa::mm_ready() || K % 32 || group_size % 32)
    return int4_dequant_mm(x, packed, scales_zeros, group_size);
  const at::Tensor xc = x.contiguous();
  const at::BFloat16* xp = xc.data_ptr<at::BFloat16>();
  at::Tensor out = at::empty({M, N}, x.options());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  const at::BFloat16* sz = scales_zeros.data_ptr<at::BFloat16>();
  at::BFloat16* op = out.data_ptr<at::BFloat16>();
  const int64_t full = N / kBlockN, per = isa::kMmPanelN / kBlockN;
  // At most kMmChunkRows rows of x a pass (each pass dequantizes the weight again), so that x's
  // tiles and a thread's sums stay bounded however long the prompt: at 1,100 rows of the 3B
  // shape on the amx set, passes of 512 rows took 1.20-1.25x oneDNN's time, one pass 1.03-1.14x
  // (results/int4_prefill/20261207T2200Z-row-passes/). A thread keeps its weight panel and sums
  // from call to call (256 KiB on amx, 128 KiB on avx512bf16, and up to 2 MiB).
  const int64_t passes = std::max<int64_t>(1, (M + isa::kMmChunkRows - 1) / isa::kMmChunkRows);
  const int64_t chunk =
      ((M + passes - 1) / passes + isa::kMmRows - 1) / isa::kMmRows * isa::kMmRows;
  for (int64_t m0 = 0; m0 < M; m0 += chunk) {  // passes of equal size, whole steps of rows
    const int64_t rows = std::min(chunk, M - m0);
    at::Tensor xt;
    const at::BFloat16* xm = isa::mm_x(xp + m0 * K, rows, K, xt);
    at::parallel_for(0, (full + per - 1) / per, 1, [&](int64_t p0, int64_t p1) {
      static thread_local std::vector<uint32_t> bt;
      static thread_local std::vector<float> c;
      isa::mm_begin();
      for (int64_t p = p0; p < p1; ++p)
        isa::mm_panel(w, sz, N, p * per, std::min(full, (p + 1) * per), K, group_size, xm, rows,
                      bt, c, op + m0 * N + p * isa::kMmPanelN, N);
      isa::mm_end();
    });
  }
  if (N % kBlockN)
    out.narrow(1, full * kBlockN, N % kBlockN)
        .copy_(at::mm(xc, int4_dequant_t(packed, scales_zeros, group_size, full * kBlockN, N)));
  return out;
}
#endif

// ---- The kernels of the vllm_omni ops themselves -----------------------------------------
//
// vllm_omni::cpu_int4_linear and cpu_int4_embedding are defined (schema and fake) in Python,
// vllm_omni/ops/int4_linear.py, which also holds their Python implementations. When a kernel
// set loads, Python asks it (register_kernels) to be their CPU kernels instead: a decode step
// calls the linear about a hundred times, and the Python body cost about 8 us per call, more than
// the GEMV itself takes for a small weight. Same branches and same values as the Python ones.

at::Tensor cpu_int4_linear(const at::Tensor& x, const at::Tensor& packed,
                           const at::Tensor& scales_zeros, int64_t group_size,
                           int64_t row_threshold, const std::optional<at::Tensor>& bias,
                           int64_t activation_bits, int64_t dequant_rows) {
  const int64_t K = x.size(-1), N = scales_zeros.size(1);
  at::Tensor x2 = x.reshape({-1, K});
  if (x2.scalar_type() != at::kBFloat16) x2 = x2.to(at::kBFloat16);
  x2 = x2.contiguous();
  const int64_t rows = x2.size(0);
  // The GEMV and the GEMM give the same bits (int4_base.h): row_threshold chooses only the
  // speed. dequant_rows (0: never; W4A16 only) rounds otherwise: the bf16 product on the
  // dequantized weights, int4_tile_mm in the amx and avx512bf16 sets, int4_dequant_mm in the
  // others.
#ifdef OMNI_BF16_MM_KERNELS
  constexpr auto dequant_mm = int4_tile_mm;
#else
  constexpr auto dequant_mm = int4_dequant_mm;
#endif
  at::Tensor y = dequant_rows > 0 && rows >= dequant_rows && activation_bits == 16
                     ? dequant_mm(x2, packed, scales_zeros, group_size)
                 : rows < row_threshold
                     ? int4_gemv(x2, packed, scales_zeros, group_size, activation_bits)
                     : int4_gemm(x2, packed, scales_zeros, group_size, activation_bits);
  if (bias.has_value()) y = y + bias->to(y.scalar_type());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(N);
  return y.view(shape).to(x.scalar_type());
}

// Rows `ids` of the weight, dequantized: ids [...] -> bf16 [..., K].
at::Tensor cpu_int4_embedding(const at::Tensor& ids, const at::Tensor& packed,
                              const at::Tensor& scales_zeros, int64_t K) {
  const int64_t N = scales_zeros.size(1), G = scales_zeros.size(0);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  packed.numel() == N * K / 2 && scales_zeros.is_contiguous() &&
                  scales_zeros.scalar_type() == at::kBFloat16 && K % G == 0,
              "cpu_int4_embedding: packed uint8 [N, K/2], scales_zeros bf16 [G, N, 2]");
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t T = flat.numel(), gs = K / G;
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
      const int64_t n = id[t], first = n / kBlockN * kBlockN, local = n - first;
      const int64_t half = std::min<int64_t>(kBlockN, N - first) / 2;
      // byte k * w/2 + local % (w/2) of its block; the high nibble for the second half of rows
      const uint8_t* p = w + first * K / 2 + local % half;
      const int shift = local >= half ? 4 : 0;
      at::BFloat16* o = dst + t * K;
      for (int64_t g = 0; g < G; ++g) {
        const float scale = static_cast<float>(sz[(g * N + n) * 2]);
        const float zero = static_cast<float>(sz[(g * N + n) * 2 + 1]);
        for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
          const int q = (p[k * half] >> shift) & 0x0F;
          o[k] = at::BFloat16(std::fma(static_cast<float>(q - 8), scale, zero));
        }
      }
    }
  });
  return out;
}

at::Tensor greedy_argmax(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0,
              "greedy_argmax: logits must be 2-D [rows, vocab]");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat,
              "greedy_argmax: logits must be bf16 or fp32, got ", logits.scalar_type());
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), n = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    o[r] = x.scalar_type() == at::kFloat ? isa::argmax(x.data_ptr<float>() + r * n, n)
                                         : isa::argmax(x.data_ptr<at::BFloat16>() + r * n, n);
    if (o[r] < 0) return at::empty({0}, out.options());  // a NaN
  }
  return out;
}

// Makes this set the CPU kernels of the two vllm_omni ops (their schemas must be defined).
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
}  // namespace omni

OMNI_LIBRARY(OMNI_NS, m) {
  m.def(
      "int4_gemv(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, "
      "int activation_bits=16) -> Tensor");
  m.def(
      "int4_gemm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size, "
      "int activation_bits=16) -> Tensor");
  m.def(
      "int4_dequant_t(Tensor packed, Tensor scales_zeros, int group_size, int n_begin, "
      "int n_end) -> Tensor");
  m.def("int4_dequant_mm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size) -> Tensor");
#ifdef OMNI_BF16_MM_KERNELS
  m.def("int4_tile_mm(Tensor x, Tensor packed, Tensor scales_zeros, int group_size) -> Tensor");
#endif
  m.def("register_kernels() -> ()", &omni::register_kernels);
  m.def("set_weight_prefetch(str mode) -> str", &omni::set_weight_prefetch);
  m.def("set_gemv_streams(int n) -> int", &omni::set_gemv_streams);
  m.def("kernel_set() -> str", &omni::kernel_set);
  m.def("greedy_argmax(Tensor logits) -> Tensor");
}

OMNI_LIBRARY_IMPL(OMNI_NS, CPU, m) {
  m.impl("int4_gemv", &omni::int4_gemv);
  m.impl("int4_gemm", &omni::int4_gemm);
  m.impl("int4_dequant_t", &omni::int4_dequant_t);
  m.impl("int4_dequant_mm", &omni::int4_dequant_mm);
#ifdef OMNI_BF16_MM_KERNELS
  m.impl("int4_tile_mm", &omni::int4_tile_mm);
#endif
  m.impl("greedy_argmax", &omni::greedy_argmax);
}
