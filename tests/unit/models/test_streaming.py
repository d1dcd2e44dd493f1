"""The streaming builder: memory, disk-space refusal, restart after a killed build."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from omni_ray.errors import UserError
from omni_ray.models import build
from omni_ray.models.build import STAMP, build_model, bytes_needed
from omni_ray.models.shapes import SHAPES

REPO = Path(__file__).resolve().parents[3]

# In a fresh interpreter: import everything, warm the streaming path up on one small tensor (so
# the first use of torch's kernels, whose code pages count in RSS, is not charged to the
# build), take VmRSS as the baseline, build, and print the baseline and the stamp. The warm-up
# leaves no freed heap that could hide a held model: it holds one block (256 KB) at most.
_CHILD = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import torch, safetensors, tokenizers
    from omni_ray.measure.peak import rss_bytes
    from omni_ray.models.build import STAMP, _tensor_blocks, build_model
    from vllm_omni.quantization.shards import ShardWriter, TensorSpec

    with tempfile.TemporaryDirectory() as d:
        spec = TensorSpec("w", torch.bfloat16, (256, 256))
        w = ShardWriter(Path(d) / "warm.safetensors", [spec])
        for block in _tensor_blocks("w", spec.shape, 0):
            w.write("w", block)
        w.close()
    baseline = rss_bytes()
    out = build_model(sys.argv[1], sys.argv[2])
    print(json.dumps({"baseline": baseline, "stamp": json.loads((out / STAMP).read_text())}))
""")


@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_weights_are_never_all_in_memory(tmp_path, shape):
    """The weights step's peak RSS stays below the baseline plus the model's bytes.

    Holding the whole model, as a dict of tensors handed to ``save_file``, costs at least its
    bytes on top of the baseline, so this bound fails for a builder that does (the old one
    peaked at 1.5x the model's bytes above the baseline, on a 3B shape). The streaming builder
    holds one block of 64K elements. The bound is the weights step's, whose high-water mark is
    reset at its start: training the tokenizer is a step of its own (and for ``small`` costs
    about as much as the model's 200 MB, unrelated to the model's size).
    """
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _CHILD, shape, str(tmp_path / "m")],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    weights = got["stamp"]["peak_rss"]["weights"]
    model_bytes = got["stamp"]["weight_bytes"]
    assert model_bytes == SHAPES[shape].num_parameters() * 2
    assert weights["reset"], "cannot reset VmHWM here: the peak would be the process's"
    assert weights["peak_rss_bytes"] < got["baseline"] + model_bytes, (got, model_bytes)


def test_shards_and_index_for_a_big_model(tmp_path, monkeypatch):
    """Past SHARD_BYTES the weights go to several files and an index that names them all."""
    monkeypatch.setattr(build, "SHARD_BYTES", 1 << 20)
    out = build_model("tiny", tmp_path / "m")
    stamp = json.loads((out / STAMP).read_text())
    files = sorted(stamp["weights_sha256"])
    assert len(files) > 1 and not (out / "model.safetensors").exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    assert index["metadata"]["total_size"] == SHAPES["tiny"].num_parameters() * 2
    from safetensors.torch import load_file

    loaded = {}
    for f in files:
        loaded |= load_file(str(out / f))
    assert set(loaded) == set(index["weight_map"])


def test_not_enough_disk_is_one_line_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_free_bytes", lambda path: 1000)
    need = bytes_needed(SHAPES["tiny"], True)
    with pytest.raises(UserError, match=rf"^{tmp_path}/m: not enough disk space for tiny: "
                                        rf"needs {need} bytes \(0\.\d\d GB\), 1000 bytes "
                                        r"\(0\.00 GB\) free$"):
        build_model("tiny", tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_not_enough_disk_from_the_cli_exits_2(tmp_path):
    """Exit 2 and one line on stderr; the free-space reading is faked in the child."""
    code = ("import sys; from omni_ray.models import build; "
            "build._free_bytes = lambda path: 1000; "
            "from omni_ray.cli import main; sys.exit(main(sys.argv[1:]))")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code, "make-model", "--shape",
                           "llama-3.1-8b-full-vocab", "--out", str(tmp_path / "m")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert "not enough disk space for llama-3.1-8b-full-vocab: needs 16" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_killed_build_leaves_a_partial_that_the_next_build_removes(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    partial = tmp_path / f".m.partial-{dead}"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    out = build_model("tiny", tmp_path / "m")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    assert (out / STAMP).is_file()


def test_full_vocab_config_and_tokenizer(tmp_path, monkeypatch):
    """A full-vocab shape: config vocab_size is the published one, the tokenizer the local one.
    (Checked on a shrunken copy of the shape, so the test writes a few MB, not 1 GB.)"""
    import dataclasses

    big = dataclasses.replace(SHAPES["tiny"], name="tiny-full-vocab", vocab_size=4096,
                              tokenizer_vocab_size=2048)
    monkeypatch.setitem(build.SHAPES, big.name, big)
    out = build_model(big.name, tmp_path / "m")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 4096
    tok = json.loads((out / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) + len(tok["added_tokens"]) - 1 == 2048
