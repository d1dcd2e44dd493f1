import subprocess
import sys


def test_imports_neither_ray_nor_vllm():
    code = (
        "import sys, omni_ray.topology, omni_ray.cli.topology\n"
        "heavy = sorted({'ray', 'vllm', 'torch'} & set(sys.modules))\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
