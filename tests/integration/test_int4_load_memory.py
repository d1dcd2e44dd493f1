"""cpu_int4 at load never holds the whole bf16 model: its load peak is a pre-quantized one's.

Two fresh interpreters load the ``small`` shape (~100M parameters, 190 MiB of bf16 weights) in
real vLLM, eager, while a sampler thread reads the process's RssAnon: once from the bf16
checkpoint with ``quantization="cpu_int4"`` (quantized at load) and once from the checkpoint
``omni-ray quantize`` writes. Quantized as each weight is loaded, the first can exceed the second
by about one bf16 tensor being packed (the largest is the 47 MiB embedding); with every bf16
parameter filled before packing (vLLM's order for a method that packs after loading) it exceeds
it by the bf16 model, ~190 MiB.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _load_main(spec_path: str, out_path: str) -> None:
    """Load one engine as the spec says; write the RssAnon before it and its peak during."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    from vllm import LLM

    from omni_ray.measure.sampler import self_rss_anon_mb
    from vllm_omni.ops import int4_linear

    int4_linear.register()  # builds or loads the native kernels: not part of either load
    kw = {"quantization": spec["quantization"]} if spec.get("quantization") else {}
    # This process only: vLLM inspects a model class once in a child (its registry cache).
    pid, peak, done = os.getpid(), [0.0], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], self_rss_anon_mb(pid))

    before = self_rss_anon_mb(pid)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    LLM(model=spec["model"], enforce_eager=True, kv_cache_memory_bytes=16 << 20,
        max_model_len=128, seed=0, **kw)
    done.set()
    sampler.join()
    Path(out_path).write_text(json.dumps({"before_mb": before, "peak_mb": peak[0]}))


def _load(tmp: Path, name: str, model: Path, quantization: str | None = None) -> dict:
    spec, out = tmp / f"{name}.spec.json", tmp / f"{name}.out.json"
    spec.write_text(json.dumps({"model": str(model), "quantization": quantization}))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env["VLLM_CACHE_ROOT"] = str(tmp / "vllm-cache")
    proc = subprocess.run([sys.executable, "-m", "tests.integration.test_int4_load_memory",
                           str(spec), str(out)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_quantized_at_load_peaks_as_a_prequantized_checkpoint_does(tmp_path):
    from safetensors import safe_open

    from omni_ray.models.build import ensure_model
    from vllm_omni.quantization.convert import quantize_checkpoint

    src = ensure_model("small")
    dst = tmp_path / "small-int4"
    quantize_checkpoint(src, dst, group_size=128)
    mib = []  # each bf16 tensor's size
    for f in src.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            mib += [math.prod(st.get_slice(k).get_shape()) * 2 / 2**20 for k in st.keys()]
    bf16_mib, largest_mib = sum(mib), max(mib)
    assert bf16_mib > 4 * largest_mib  # the bound below tells the two orders apart

    checkpoint = _load(tmp_path, "checkpoint", dst)
    at_load = _load(tmp_path, "at-load", src, quantization="cpu_int4")
    grew = {k: r["peak_mb"] - r["before_mb"] for k, r in (("at_load", at_load),
                                                          ("checkpoint", checkpoint))}
    print(f"\nload peak above the start (MiB): {grew}; bf16 model {bf16_mib:.0f}, "
          f"largest tensor {largest_mib:.0f}")
    assert grew["at_load"] - grew["checkpoint"] < largest_mib + 0.25 * (bf16_mib - largest_mib)


if __name__ == "__main__":
    _load_main(sys.argv[1], sys.argv[2])
