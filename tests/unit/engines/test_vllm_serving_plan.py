"""The serving plan: prompts from the shipped prompt file through the model's own tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

from omni_ray.config.schema import StageConfig, workload_from_dict
from omni_ray.engines.request import EngineRequest
from omni_ray.engines.vllm_serving import _plan
from omni_ray.workload.serving import read_prompt_file

PROMPTS = Path(__file__).resolve().parents[3] / "configs" / "prompts" / "everyday.txt"


def _req(**workload):
    return EngineRequest(stage=StageConfig(model="tiny", kv_cache_mib=64),
                         workload=workload_from_dict({"mode": "serving", **workload}))


def test_prompt_file_prompts_are_the_tokenizers_ids(tiny_model):
    from transformers import AutoTokenizer

    req = _req(prompt_file=str(PROMPTS), output_len=8, output_len_max=12)
    plan = _plan(req, 20, 32000, str(tiny_model), 512, random.Random(0))
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    encoded = {tuple(tok(t)["input_ids"]) for t in read_prompt_file(str(PROMPTS))}
    assert len(plan) == 20 and all(tuple(p.prompt) in encoded for p in plan)
    assert all(8 <= p.output_len <= 12 for p in plan)


def test_prompt_file_prompts_are_cut_to_fit(tiny_model):
    req = _req(prompt_file=str(PROMPTS), output_len=8)
    plan = _plan(req, 10, 32000, str(tiny_model), 12, random.Random(0))
    assert all(1 <= len(p.prompt) <= 4 for p in plan)


def test_random_prompts_have_the_drawn_lengths(tiny_model):
    plan = _plan(_req(prompt_len=5, prompt_len_max=9), 50, 32000, str(tiny_model), 512,
                 random.Random(1))
    assert {len(p.prompt) for p in plan} <= set(range(5, 10)) and len({len(p.prompt)
                                                                       for p in plan}) > 1
    assert len({tuple(p.prompt) for p in plan}) == 50  # distinct: no prefix-cache hits
