import subprocess
import sys

HEAVY = ("ray", "vllm", "torch", "transformers", "vllm_omni")


def test_measure_imports_neither_ray_nor_vllm():
    code = ("import sys, omni_ray.measure.sampler, omni_ray.measure.pinning, "
            "omni_ray.measure.cpuload, omni_ray.measure.clock\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
