// cpu_int4's AMX kernel set, torch.ops namespace vllm_omni_amx: the avx512 set (its GEMV, its
// dequantization, its argmax) with the GEMM on AMX tiles, W4A16 and W4A8 alike. It needs the
// avx512 set's flags and AMX-TILE with AMX-INT8 (Intel Sapphire Rapids and later). The tiles and
// why they give the other sets' bits: int4_avx512.cpp, under OMNI_AMX.
#define OMNI_AMX 1
#include "int4_avx512.cpp"
