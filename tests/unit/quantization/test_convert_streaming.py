"""The converter's memory: a subprocess quantizes ``small`` (200 MB of bf16)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# Imports (vLLM's among them: the quantization config is vLLM's) and a warm-up conversion of
# ``tiny`` come first, so neither is charged to the conversion; then the high-water mark is
# reset and the baseline taken.
_CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from omni_ray.measure.peak import peak_rss_bytes, reset_peak, rss_bytes
    from omni_ray.models.build import build_model
    from vllm_omni.quantization.convert import quantize_checkpoint

    tmp = Path(sys.argv[1])
    quantize_checkpoint(build_model("tiny", tmp / "tiny"), tmp / "tiny-int4")
    src = build_model("small", tmp / "small")
    assert reset_peak()
    baseline = rss_bytes()
    quantize_checkpoint(src, tmp / "small-int4")
    print(json.dumps({"baseline": baseline, "peak": peak_rss_bytes(),
                      "source_bytes": json.loads((src / "omni_model.json").read_text())[
                          "weight_bytes"]}))
""")


def test_quantize_never_holds_the_model(tmp_path):
    """Peak RSS of the conversion < baseline + the source's bytes.

    The old converter read through a memory map (every page read stayed in RSS) and gathered
    up to 2 GiB of output before writing: at least the source's bytes above the baseline. The
    streaming one holds a block of 1M elements and its fp32 temporaries (some 20 MB).
    """
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True,
                          text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["source_bytes"] == 200_185_344
    assert got["peak"] < got["baseline"] + got["source_bytes"], got
