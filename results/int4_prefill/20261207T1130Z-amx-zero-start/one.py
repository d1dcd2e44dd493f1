# One configuration (OMNI_AMX_SKIP / OMNI_AMX_MC from the environment): the amx GEMM's median time.
import sys, time, torch
from vllm_omni.ops import native, int4_pack
from vllm_omni.quantization import grid
threads, n, k, m, bits = (int(a) for a in sys.argv[1:6])
torch.set_num_threads(threads)
o = native.ops("amx")
g = torch.Generator().manual_seed(0)
w = torch.randn(n, k, generator=g).bfloat16(); qw = grid.quantize(w, 128); p, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
x = torch.randn(m, k, generator=g).bfloat16()
if bits == 0:
    f = lambda: torch.nn.functional.linear(x, w)
else:
    f = lambda: o.int4_gemm(x, p, sz, 128, bits)
f(); f()
ts = []
for _ in range(9):
    t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
print(f"{sorted(ts)[4] * 1e3:.2f}")
