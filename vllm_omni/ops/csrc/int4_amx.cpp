// cpu_int4's AMX kernel set, torch.ops namespace vllm_omni_amx: the avx512 set (its GEMV, its
// dequantization, its argmax) with the GEMM on AMX tiles, W4A16 and W4A8 alike, and W4A16's
// many-row bf16 product on AMX-BF16 tiles (int4_tile_mm). It needs the avx512 set's flags and
// AMX-TILE with AMX-INT8 and AMX-BF16 (Intel Sapphire Rapids and later). The tiles and why the
// GEMM gives the other sets' bits: int4_avx512.cpp, under OMNI_AMX.
#define OMNI_AMX 1
#include "int4_avx512.cpp"
