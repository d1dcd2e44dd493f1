"""vLLM cpu_int4 decode against llama.cpp Q4_0 decode, as interleaved pairs seconds apart.

    python -m omni_ray.bench.decode_pairs --pairs 20 --cpp-wrapper --serial-kernels \\
        --out results/decode_pairs/

Why: ``int4_peers`` runs each engine as its own arm, minutes apart (a compiled vLLM arm compiles
for ~2.5 minutes first), and on this shared machine the speed of the same decode drifts by more
than 10 % over minutes: its per-pass ratios of one run were 0.84x, 0.87x and 0.99x. Here one
in-process vLLM engine (compiled unless ``--eager``) stays up, and each pair is one vLLM decode
measurement and one llama-bench decode run back to back, the order alternating, so both sides of a
pair see nearly the same machine. The result is the median of the pairwise ratios.

Matched work: vLLM decodes ``--output-len`` tokens after a prompt of ``--depth`` tokens (a step's
time by difference, (t(n + 1) - t(1)) / n, prefill cancels out); llama-bench runs
``-p 0 -n <output-len> -d <depth>``: the same number of tokens decoded after ``--depth`` tokens in
its KV cache. Same CPUs, same thread count.

Idle engine while the peer runs: the engine's OpenMP threads spin between parallel regions, and
with ``OMP_WAIT_POLICY=ACTIVE`` alone they would spin forever and take llama.cpp's cores. The
engine runs with a finite ``GOMP_SPINCOUNT`` (``--spin-count``; long enough to cover the gaps
inside a decode step), the peer starts ``--gap`` seconds after the engine's last step, and the CPU
time the engine's process used while the peer ran is recorded per pair
(``engine_cpu_s_during_peer``) and checked against ``MAX_ENGINE_CPU_SHARE`` of the peer's wall
time: a pair over it is flagged.

The models: the shape's cpu_int4 g128 checkpoint and its Q4_0 GGUF, made once as ``int4_peers``
makes them (or ``--model`` and ``--gguf``). Writes ``<out>/<UTC timestamp>.json`` with provenance.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from omni_ray import envs
from omni_ray.bench.common import ISAS, force_isa, pairwise, save_and_exit, spread_pct
from omni_ray.bench.step_ab import STAGE, decode_step_ms, in_process_engine, pair_order

VLLM, PEER = "vllm_cpu_int4", "llamacpp_q4_0"
# Share of the peer's wall time this process may spend on CPU before the pair is flagged. Not
# zero: starting llama-bench and reading its JSON is this process's work too (~20 ms a pair).
MAX_ENGINE_CPU_SHARE = 0.05


def engine_cpu_s() -> float:
    """CPU seconds (user + system) all threads of this process have used so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def summarize(tok_s: dict[str, list[float]], engine_cpu: list[float],
              peer_wall: list[float]) -> dict:
    """Per side the median tok/s and its spread; the pairwise ratios vLLM / llama.cpp, their
    median, how many pairs vLLM won, and the pairs where the engine was not idle."""
    ratios, median, vllm_faster = pairwise(tok_s[VLLM], tok_s[PEER])
    busy = [i for i, (c, w) in enumerate(zip(engine_cpu, peer_wall))
            if c > MAX_ENGINE_CPU_SHARE * w]
    return {"median_tok_s": {k: statistics.median(v) for k, v in tok_s.items()},
            "spread_pct": {k: spread_pct(v) for k, v in tok_s.items()},
            "pairwise_ratios": ratios,
            "pairwise_ratio_median": median,
            "pairs_vllm_faster": vllm_faster,
            "pairs_engine_busy_during_peer": busy}


def tune_peer(gguf: Path, cpus: list[int], depth: int, output_len: int,
              repetitions: int) -> dict:
    """llama.cpp at its best for this decode: every setting its users tune (``-fa on/off``, the
    slot's thread counts) in one llama-bench run; the fastest record, with what it tried."""
    from omni_ray.peers import llamacpp

    best = llamacpp.bench_best(gguf, cpus=cpus, n_prompt=(0,), n_gen=output_len,
                               n_depth=(depth,), repetitions=repetitions, timeout=1200)
    if len(best) != 1:
        raise RuntimeError(f"llama-bench returned {len(best)} tests, expected 1: {best}")
    return best[0]


def peer_tok_s(gguf: Path, cpus: list[int], depth: int, output_len: int,
               repetitions: int, setting: dict | None = None) -> float:
    """llama-bench's decode tok/s: ``output_len`` tokens after ``depth`` in its KV cache, with
    ``setting`` (``tune_peer``'s winner; None: llama-bench's defaults, all the slot's CPUs)."""
    from omni_ray.peers import llamacpp

    setting = setting or {}
    recs = llamacpp.bench(gguf, threads=setting.get("threads") or len(cpus), n_prompt=(0,),
                          n_gen=output_len, n_depth=(depth,), repetitions=repetitions,
                          cpus=cpus, timeout=600,
                          flash_attn=(setting["flash_attn"],) if setting.get("flash_attn") else ())
    if len(recs) != 1:
        raise RuntimeError(f"llama-bench returned {len(recs)} tests, expected 1: {recs}")
    return recs[0]["avg_ts"]


def llamacpp_label(setting: dict) -> str:
    from omni_ray.peers.llamacpp import setting_label

    return setting_label(setting)


def vllm_regime(model: Path | str, cpus: list[int]) -> dict:
    from omni_ray.engine.runner import decode_regime

    return decode_regime(str(model), cpus)


def gguf_regime(gguf: Path, cpus: list[int]) -> dict:
    """A GGUF's every tensor is read once a token (a tied token_embd is the output head)."""
    from omni_ray.measure.regime import describe
    from omni_ray.topology.caches import detect_llc

    llc = detect_llc()
    return describe(Path(gguf).stat().st_size, llc.bytes_for(cpus) if llc else None)


def run(args: argparse.Namespace) -> dict:
    from omni_ray.engine.runner import GREEDY
    from omni_ray.workload.prompts import token_prompts

    cpus = sorted(os.sched_getaffinity(0))
    stage = dict(STAGE, max_model_len=max(STAGE["max_model_len"], args.depth + args.output_len + 1),
                 enforce_eager=args.eager, cpp_wrapper=args.cpp_wrapper,
                 serial_kernels=args.serial_kernels,
                 env={"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": str(args.spin_count)})
    llm, model = in_process_engine(stage, cpus, args.shape, args.model)
    if args.gguf:
        gguf = Path(args.gguf)
    else:
        from omni_ray.bench.int4_peers import ensure_ggufs, ensure_int4

        bf16, int4 = ensure_int4(args.shape, envs.cache_dir() / "bench" / "int4_peers")
        gguf = ensure_ggufs(bf16, int4.parent)["Q4_0"]
    import vllm_omni

    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    prompt = token_prompts(1, args.depth, vocab, seed=1)
    sampling = dict(GREEDY, detokenize=False)  # token ids, as llama-bench

    def vllm_side() -> float:
        ms, _ = decode_step_ms(llm, prompt, args.output_len, sampling)
        return 1e3 / ms

    cpu_during_peer: list[float] = []
    peer_wall: list[float] = []
    time.sleep(args.gap)  # the engine's OpenMP threads stop spinning
    tuned = tune_peer(gguf, cpus, args.depth, args.output_len, args.peer_repetitions)
    print(f"llama.cpp tuned: {tuned['setting_label']} was fastest of "
          + ", ".join(f"{llamacpp_label(t['setting'])} {t['avg_ts']:.1f}" for t in tuned["tried"])
          + " tok/s", flush=True)

    def peer_side() -> float:
        time.sleep(args.gap)  # the engine's OpenMP threads stop spinning
        c0, w0 = engine_cpu_s(), time.monotonic()
        tok_s = peer_tok_s(gguf, cpus, args.depth, args.output_len, args.peer_repetitions,
                           tuned["setting"])
        cpu_during_peer.append(engine_cpu_s() - c0)
        peer_wall.append(time.monotonic() - w0)
        return tok_s

    sides = {VLLM: vllm_side, PEER: peer_side}
    for fn in sides.values():  # warm-up of both, not counted
        fn()
    cpu_during_peer.clear()
    peer_wall.clear()
    tok_s: dict[str, list[float]] = {VLLM: [], PEER: []}
    for i in range(args.pairs):
        for side in pair_order(i, VLLM, PEER):
            tok_s[side].append(sides[side]())
        r = tok_s[VLLM][-1] / tok_s[PEER][-1]
        print(f"pair {i + 1}/{args.pairs}: vLLM {tok_s[VLLM][-1]:.1f} tok/s, llama.cpp "
              f"{tok_s[PEER][-1]:.1f} tok/s, ratio {r:.3f}", flush=True)
    return {"model": str(model), "gguf": str(gguf), "shape": args.shape,
            "mode": "eager" if args.eager else "compiled", "cpp_wrapper": args.cpp_wrapper,
            "serial_kernels": args.serial_kernels, "stage": stage, "cpus": cpus,
            "pairs": args.pairs, "depth": args.depth, "output_len": args.output_len,
            "peer_repetitions": args.peer_repetitions, "gap_s": args.gap,
            "tok_s": tok_s, "engine_cpu_s_during_peer": cpu_during_peer,
            "peer_wall_s": peer_wall,
            "peer_setting": tuned["setting"], "peer_settings_tried": tuned["tried"],
            "decode_regime": {VLLM: vllm_regime(model, cpus), PEER: gguf_regime(gguf, cpus)},
            **summarize(tok_s, cpu_during_peer, peer_wall),
            "patch_report": vllm_omni.patch_report(), "kernels": vllm_omni.kernel_report()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m omni_ray.bench.decode_pairs",
                                description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=20)
    p.add_argument("--depth", type=int, default=128,
                   help="tokens before the decode: vLLM's prompt, llama-bench's -d (default 128)")
    p.add_argument("--output-len", type=int, default=64, help="tokens decoded (default 64)")
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--model", help="a cpu_int4 checkpoint directory (default: the shape's)")
    p.add_argument("--gguf", help="the llama.cpp model (default: the shape's Q4_0 GGUF)")
    p.add_argument("--eager", action="store_true", help="enforce_eager (default: compiled)")
    p.add_argument("--cpp-wrapper", action="store_true", help="omni-ray's stage.cpp_wrapper")
    p.add_argument("--serial-kernels", action="store_true",
                   help="omni-ray's stage.serial_kernels")
    p.add_argument("--peer-repetitions", type=int, default=1,
                   help="llama-bench -r per pair (default 1; it warms up first anyway)")
    p.add_argument("--spin-count", type=int, default=10_000_000,
                   help="GOMP_SPINCOUNT of the engine (default 1e7)")
    p.add_argument("--gap", type=float, default=1.0,
                   help="seconds between the engine's last step and the peer's start (default 1)")
    p.add_argument("--isa", choices=ISAS, default="native",
                   help="avx2: the engine on vllm_omni's and torch's AVX2 kernels and an AVX2-only "
                        "llama.cpp, as an AVX2-only CPU runs them (bench/common.py)")
    p.add_argument("--out", default="results/decode_pairs/")
    return p


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("pairs", "peer_repetitions"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.output_len < 2:
        p.error(f"--output-len: decode by difference needs at least 2, got {args.output_len}")
    if args.depth < 1:
        p.error(f"--depth must be at least 1 (vLLM needs a prompt), got {args.depth}")
    if args.spin_count < 0 or args.gap < 0:
        p.error(f"--spin-count and --gap must be >= 0, got {args.spin_count}, {args.gap}")
    if (args.cpp_wrapper or args.serial_kernels) and args.eager:
        p.error("--cpp-wrapper and --serial-kernels need a compiled engine; drop --eager")
    if args.model and not Path(args.model).is_dir():
        p.error(f"--model: not a checkpoint directory: {args.model}")
    if args.gguf and not Path(args.gguf).is_file():
        p.error(f"--gguf: no such file: {args.gguf}")


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    check(p, args)
    # before torch is imported (run() imports vLLM): ATEN_CPU_CAPABILITY is read then
    os.environ.update(force_isa(args.isa))
    body = dict(run(args), isa=args.isa)
    med = body["median_tok_s"]
    regime = body["decode_regime"]
    save_and_exit(args.out, "decode_pairs", body, __spec__.name, argv,
                  f"decode at depth {body['depth']}: vLLM cpu_int4 {med[VLLM]:.1f} tok/s "
                  f"({regime[VLLM]['decode_regime']}), llama.cpp Q4_0 {med[PEER]:.1f} tok/s "
                  f"({regime[PEER]['decode_regime']}, best setting "
                  f"{llamacpp_label(body['peer_setting'])}); pairwise ratio median "
                  f"{body['pairwise_ratio_median']:.3f} ({body['pairs_vllm_faster']}/"
                  f"{body['pairs']} pairs vLLM faster; engine busy during the peer in "
                  f"{len(body['pairs_engine_busy_during_peer'])} pairs)")


if __name__ == "__main__":
    main()
