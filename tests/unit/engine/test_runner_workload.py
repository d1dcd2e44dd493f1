"""run_workload's requests, against a recording stand-in for vllm.LLM (no engine runs here)."""

import types

import pytest

from omni_ray.config import WorkloadConfig
from omni_ray.engine.runner import run_workload


class RecordingLLM:
    """Answers generate() with the requested number of token ids and keeps every request."""

    def __init__(self) -> None:
        self.params = []

    def generate(self, prompts, params, use_tqdm=False):
        self.params.append(params)
        out = types.SimpleNamespace(token_ids=list(range(params.max_tokens)))
        return [types.SimpleNamespace(outputs=[out]) for _ in prompts]


class NoSampler:
    def mark(self, name): pass

    def settled_anon_mb(self): return 0.0


@pytest.mark.parametrize("detokenize", [True, False])
def test_every_request_carries_the_workloads_detokenize(detokenize):
    llm = RecordingLLM()
    wl = {"batch": 1, "prompt_len": 8, "output_len": 4, "warmup": 1, "repeats": 2,
          "context_len": 16, "detokenize": detokenize}
    out = run_workload(llm, WorkloadConfig(**wl), vocab_size=1000, sampler=NoSampler(), seed=0)
    assert len(llm.params) == 1 + 1 + 2 * 2  # warm-up, context fill, repeats of 1 and N tokens
    assert {p.detokenize for p in llm.params} == {detokenize}
    assert {p.temperature for p in llm.params} == {0.0}
    assert out["output_token_ids"] == [0, 1, 2, 3]


def test_detokenize_defaults_to_vllms_own_default():
    llm = RecordingLLM()
    run_workload(llm, WorkloadConfig(batch=1, prompt_len=8, output_len=4, warmup=0, repeats=1),
                 vocab_size=1000, sampler=NoSampler(), seed=0)
    assert {p.detokenize for p in llm.params} == {True}


def test_each_repeat_says_its_window_as_it_is_measured():
    said = []
    run_workload(RecordingLLM(), WorkloadConfig(batch=2, prompt_len=8, output_len=4, warmup=1,
                                                repeats=3),
                 vocab_size=1000, sampler=NoSampler(), seed=0,
                 progress=lambda **f: said.append(f))
    assert len(said) == 3  # the repeats, not the warm-up
    assert {w["prefill_tokens"] for w in said} == {16}
    assert all(w["prefill_tok_s"] > 0 for w in said)
