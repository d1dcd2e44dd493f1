// cpu_int4's portable kernel set, torch.ops namespace vllm_omni_portable: plain C++ that any
// compiler and CPU builds (aarch64, ppc64le, x86 without AVX2), with the same bits as the vector
// sets (int4_base.h defines the arithmetic; int4_ops.h the ops). Slower, and correct.

#include "int4_base.h"

namespace omni {
namespace isa {

constexpr const char* kName = "portable";
constexpr int kRows = 1;
constexpr int kStreamBlocks = 1;
constexpr int kGemvStreams = 1;

template <bool A8>
inline void fixed_point(const at::BFloat16* x, int64_t K, int64_t gs, int8_t* hi, int8_t* lo,
                        float* step, int32_t* csum, float* xsum) {
  fixed_point_scalar<A8>(x, K, gs, hi, lo, step, csum, xsum);
}

template <int Hint>
void block64(int rows, const uint8_t* w, const at::BFloat16* sz, int64_t n_total, int64_t n0,
             int64_t K, int64_t gs, const FixedX& fx, int64_t m0, at::BFloat16* out,
             int64_t ldo) {
  block_scalar(rows, w, kBlockN, sz, n_total, n0, K, gs, fx, m0, out, ldo);
}

inline void dequant64(const uint8_t* p, const at::BFloat16* sz, int64_t gs, at::BFloat16* out,
                      int64_t ld) {
  dequant_scalar(p, kBlockN, sz, gs, 0, out, ld);
}

constexpr int kTileRows = 4;

inline void unpack64(const uint8_t* p, int64_t gs, int32_t* qb) { unpack_scalar(p, gs, qb); }

inline void store64(const float* o, at::BFloat16* out) {
  for (int j = 0; j < kBlockN; ++j) out[j] = to_bf16(o[j]);
}

inline void tile(int rows, const GemmGroup& gg, const GemmRows& x, float* o) {
  tile_scalar(rows, gg, x, o);
}

template <typename T>
int64_t argmax(const T* row, int64_t n) {
  return argmax_scalar(row, n);
}

}  // namespace isa
}  // namespace omni

#include "int4_ops.h"
