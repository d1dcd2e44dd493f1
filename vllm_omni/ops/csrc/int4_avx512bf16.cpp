// cpu_int4's AVX512_BF16 kernel set, torch.ops namespace vllm_omni_avx512bf16: the avx512 set
// (its GEMV, GEMM, dequantization and argmax, the same bits) with W4A16's many-row bf16 product
// (int4_tile_mm) on AVX512_BF16 registers (vdpbf16ps) instead of a torch.mm per chunk of
// dequantized weights. It needs the avx512 set's flags and AVX512_BF16 (AMD Zen 4 and later,
// Intel Cooper Lake and Sapphire Rapids and later; where AMX is there too, the amx set is
// preferred). The product and its layout: int4_avx512.cpp, under OMNI_AVX512BF16.
#define OMNI_AVX512BF16 1
#include "int4_avx512.cpp"
