"""A ``-full-vocab`` shape on real vLLM: the model's vocabulary is larger than the tokenizer's
(as Qwen2.5's padded rows are), so prompts and generated ids above the tokenizer must pass
validation and detokenize (to nothing) without an error. Checked on a shrunken copy of the
shape (tiny layers, 4096 rows, a 2048-token tokenizer), both in one fresh interpreter, streamed and
sharded like a big build, bf16 and int4 (a quantized, padded head).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

CHILD = """
import gc, json, os, sys
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
from vllm import LLM, SamplingParams
for model in sys.argv[1:]:  # one after another: vLLM's import is paid once
    llm = LLM(model=model, enforce_eager=True, kv_cache_memory_bytes=64 << 20,
              max_model_len=256, seed=0)
    prompt = [3000 + i for i in range(32)] + [5, 6, 7]  # ids above the 2048-token tokenizer
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                      detokenize=True), use_tqdm=False)[0].outputs[0]
    print(json.dumps({"model": model, "vocab": llm.llm_engine.model_config.get_vocab_size(),
                      "tokens": list(out.token_ids), "text": out.text}))
    del llm
    gc.collect()
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import dataclasses

    from omni_ray.models import build
    from omni_ray.models.shapes import SHAPES
    from vllm_omni.quantization.convert import quantize_checkpoint

    tmp = tmp_path_factory.mktemp("full-vocab")
    shape = dataclasses.replace(SHAPES["tiny"], name="tiny-full-vocab", vocab_size=4096,
                                tokenizer_vocab_size=2048)
    saved = build.SHAPES.get(shape.name), build.SHARD_BYTES
    build.SHAPES[shape.name], build.SHARD_BYTES = shape, 1 << 20  # several shards
    try:
        bf16 = build.build_model(shape.name, tmp / "bf16")
    finally:
        build.SHARD_BYTES = saved[1]
        del build.SHAPES[shape.name]
    assert (bf16 / "model.safetensors.index.json").is_file()
    return {"bf16": bf16, "int4": quantize_checkpoint(bf16, tmp / "int4").dst}


@pytest.fixture(scope="module")
def generated(models):
    """Each model's vocabulary, tokens and text, both engines in one fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(models["bf16"]), str(models["int4"])],
                          cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith('{"model": ')]
    return {kind: next(x for x in lines if x["model"] == str(models[kind]))
            for kind in ("bf16", "int4")}


@pytest.mark.parametrize("kind", ["bf16", "int4"])
def test_ids_beyond_the_tokenizer_generate_and_detokenize(generated, kind):
    got = generated[kind]
    assert got["vocab"] == 4096 and len(got["tokens"]) == 16
    assert all(0 <= t < 4096 for t in got["tokens"])
