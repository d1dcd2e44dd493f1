import sys, time, torch
from vllm_omni.ops import native, int4_pack
from vllm_omni.quantization import grid
torch.set_num_threads(1)
name, bits, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
o = native.ops(name) if name != "bf16" else None
n, k = 11008, 2048
w = torch.randn(n, k).bfloat16(); qw = grid.quantize(w, 128); p, sz = int4_pack.repack(qw.packed, qw.scale, qw.zero)
x = torch.randn(rows, k).bfloat16()
f = (lambda: torch.nn.functional.linear(x, w)) if name == "bf16" else (lambda: o.int4_gemm(x, p, sz, 128, bits))
f()
t0 = time.process_time(); c = 0
while time.process_time() - t0 < float(sys.argv[4]) if len(sys.argv) > 4 else 3:
    f(); c += 1
print(name, bits, rows, round((time.process_time() - t0) / c * 1e3, 2), "ms")
