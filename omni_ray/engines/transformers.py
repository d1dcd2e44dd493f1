"""Hugging Face transformers, eager (no torch.compile), the model's dtype: the baseline a user
tries first.

``AutoModelForCausalLM.from_pretrained`` with the attention transformers picks by default
(SDPA on CPU), ``model.generate`` greedy with ``min_new_tokens`` so no EOS stops a run early.
The figures mean what vLLM's do (``omni_ray.engines.vllm.timing_figures``): prefill is the
one-token run of ``batch`` prompts of ``prompt_len`` token ids, decode per step is
(N-token run - 1-token run) / (N - 1), after ``prompt_len`` tokens of context; ``context_len``
runs one prompt of that length first and records the RssAnon it leaves (as vLLM's does, the
measured prompts do not attend to it). The weights are copied into anonymous memory after
loading (``anonymous_weights``), so RssAnon counts them as it does vLLM's. ``detokenize: true`` decodes the output ids to text inside
the timed run, as vLLM's detokenizer does per step.
"""

from __future__ import annotations

import time

from omni_ray.engines import Session, common_env, slot_threads, window_rates
from omni_ray.engines.request import EngineRequest
from omni_ray.measure.clock import Stopwatch
from omni_ray.workload.prompts import token_prompts

TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def anonymous_weights(model, torch) -> None:
    """Copy every weight into anonymous memory. transformers maps a safetensors checkpoint of
    the same dtype and keeps its tensors on the file's pages: RssAnon would then leave the
    weights out, where vLLM's (and llama.cpp's, run with ``-lm none``) are counted. A tied
    weight is one parameter and is copied once."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()


class TransformersEngine:
    name = "transformers"
    resident = True

    def __init__(self) -> None:
        self.model = self.tokenizer = self.torch = self.transformers = None

    def environment(self, req: EngineRequest) -> dict[str, str]:
        return common_env(req) | dict(req.stage.env)

    def load(self, session: Session) -> dict:
        with Stopwatch() as imp:
            import torch
            import transformers
        self.torch, self.transformers = torch, transformers
        torch.set_num_threads(slot_threads(session.req))
        session.sampler.mark("load_start")
        session.phase("loading")
        with Stopwatch() as init:
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                session.model_path, dtype=getattr(torch, TORCH_DTYPES[session.req.stage.dtype]))
            self.model.eval()
            anonymous_weights(self.model, torch)
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(session.model_path)
        return {"import_s": imp.elapsed, "init_s": init.elapsed,
                "attn_implementation": self.model.config._attn_implementation,
                "torch_threads": torch.get_num_threads()}

    def _generate(self, prompts: list[list[int]], n: int, detokenize: bool):
        torch = self.torch
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode(), Stopwatch() as sw:
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                min_new_tokens=n, do_sample=False, num_beams=1, use_cache=True,
                pad_token_id=self.tokenizer.eos_token_id or 0)
            if detokenize:
                self.tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
        return sw.elapsed, out[0, ids.shape[1]:].tolist()

    def run(self, session: Session) -> dict:
        from omni_ray.engines.vllm import decode_regime, timing_figures

        req, wl = session.req, session.req.workload
        vocab = self.model.config.vocab_size
        calls = iter(range(1, 1 << 30))

        def prompts(length: int = wl.prompt_len) -> list[list[int]]:
            return token_prompts(wl.batch, length, vocab, seed=req.seed * 1_000_003 + next(calls))

        for _ in range(wl.warmup):
            self._generate(prompts(), wl.output_len, wl.detokenize)
        out: dict = {}
        if wl.context_len:
            self._generate(prompts(wl.context_len), 1, False)
            time.sleep(0.1)
            session.sampler.mark("context")
            out["rss_anon_at_context_mb"] = session.sampler.settled_anon_mb()
        t_one, t_n, first = [], [], None
        for _ in range(wl.repeats):
            t_one.append(self._generate(prompts(), 1, wl.detokenize)[0])
            t, tokens = self._generate(prompts(), wl.output_len, wl.detokenize)
            t_n.append(t)
            first = first or tokens
            session.progress(**window_rates(batch=wl.batch, prompt_len=wl.prompt_len,
                                            output_len=wl.output_len, t_one=t_one[-1], t_n=t))
        out |= timing_figures(t_one, t_n, batch=wl.batch, prompt_len=wl.prompt_len,
                              output_len=wl.output_len) | {"output_token_ids": first}
        if out.get("decode_tok_s") is not None:
            out.update(decode_regime(session.model_path, req.cpus,
                                     self.weight_bytes(req, session.model_path)))
        if wl.quality is not None:  # after the speed, on the same model
            session.phase("quality")
            out.update(self.quality_probe(session, vocab))
        return out

    def quality_probe(self, session: Session, vocab_size: int) -> dict:
        """The fixed quality probe (``workload/quality.py``): one forward pass over the sequence
        gives each id's log-probability (log-softmax of the float32 logits, as vLLM's raw
        log-probabilities), then ``tokens`` greedy ids after it."""
        from omni_ray.workload.quality import probe_figures, probe_ids

        torch, req = self.torch, session.req
        q = req.workload.quality
        ids = probe_ids(vocab_size, q["sequence_len"])
        x = torch.tensor([ids], dtype=torch.long)
        with torch.inference_mode():
            logits = self.model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)[:-1].gather(
                1, x[0, 1:, None])[:, 0].tolist()
        _, greedy = self._generate([ids], q["tokens"], False)
        return probe_figures(ids=ids, logprobs=logprobs, greedy_ids=greedy, tokens=q["tokens"],
                             model_path=session.model_path, dtype=req.stage.dtype,
                             quantization=req.stage.quantization)

    @staticmethod
    def weight_bytes(req: EngineRequest, model_path: str) -> int | None:
        """What a decode token reads: the checkpoint in the stage's dtype."""
        from omni_ray.engines.vllm import checkpoint_weight_bytes

        return checkpoint_weight_bytes(model_path, None, req.stage.dtype)

    def report(self) -> dict:
        versions = {"transformers": self.transformers.__version__,
                    "torch": self.torch.__version__}
        self.model = None
        return {"engine_report": {"versions": versions}}


ENGINE = TransformersEngine
