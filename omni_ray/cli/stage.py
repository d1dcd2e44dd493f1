"""omni-ray stage: run one arm directly on one slot of this machine (no Ray, no sweep file)."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="a make-model shape or a model directory")
    p.add_argument("--engine", choices=["vllm", "llamacpp", "transformers"], default=None,
                   help="default: vllm")
    p.add_argument("--kv-cache-mib", type=int, default=None, help="vllm's KV budget (required)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--quantization", choices=["cpu_int4", "cpu_int4_a8", "Q8_0", "Q4_0"],
                   default=None, help="cpu_int4, cpu_int4_a8 (vllm; _a8: W4A8 activations); "
                                      "Q8_0, Q4_0 (llamacpp)")
    p.add_argument("--compiled", action="store_true", help="torch.compile (default: eager)")
    p.add_argument("--multiprocessing", action="store_true",
                   help="vLLM's own EngineCore process (default: in-process)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context-len", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-detokenize", dest="detokenize", action="store_false", default=None,
                   help="token ids only (what llama.cpp measures; its arms need it)")
    p.add_argument("--slot-cores", type=int, default=None,
                   help="cores of the slot to pin to (default: the whole first node)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", default=None, help="write the full result record (JSON) here")


def run(args: argparse.Namespace) -> int:
    from omni_ray import api

    # Only what was given: every other field takes the schema's default, and a field the
    # engine has no meaning for is refused by the schema, not passed along.
    stage = {"model": args.model, "engine": args.engine, "kv_cache_mib": args.kv_cache_mib,
             "quantization": args.quantization, "max_model_len": args.max_model_len,
             "enforce_eager": False if args.compiled else None,
             "multiprocessing": args.multiprocessing or None}
    workload = {"prompt_len": args.prompt_len, "output_len": args.output_len,
                "batch": args.batch, "context_len": args.context_len or None,
                "repeats": args.repeats, "detokenize": args.detokenize}
    record = api.run_stage(
        {k: v for k, v in stage.items() if v is not None},
        {k: v for k, v in workload.items() if v is not None},
        slot_cores=args.slot_cores, timeout_s=args.timeout, out=args.out)
    m = record["measurements"]
    keys = ("ready_s", "init_s", "rss_anon_tree_mb", "peak_rss_anon_during_load_mb",
            "kv_cache_tokens", "ttft_s", "prefill_tok_s", "decode_tok_s")
    print(json.dumps({"status": record["status"], "error": record["error"],
                      "slot": record["slot"]["name"], **{k: m.get(k) for k in keys}}, indent=2))
    return 0 if record["status"] == "ok" else 1
