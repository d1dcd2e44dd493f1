"""Proof of speed and size (#3): vLLM cpu_int4 vs vLLM bf16 vs llama.cpp, side by side, one run.

    python -m omni_ray.bench.int4_peers --shape qwen2.5-0.5b --out results/int4/

One run, on the same cores (default 0,1), batch 1:

- vLLM bf16 and vLLM cpu_int4 g128 (an ``omni-ray quantize``d checkpoint), each eager and
  compiled, each with prompt 128 and prompt 512: one fresh engine process per arm
  (``launch_arm``, in-process engine core, KV budget 256 MiB, max_model_len 1024, warmup 1,
  repeats 3, token ids only: not detokenized, as llama-bench does not). Decode tok/s by
  difference (output 64), prefill tok/s from the time to first token, settled RssAnon and the
  peak during load.
- llama.cpp ``llama-bench`` on GGUFs converted from the same weights: bf16 and Q4_0, -t 2,
  pp128 and pp512 (from an empty cache, like the vLLM arms' prefill), and tg64 at depths 128 and
  512 (``-d``: that many tokens in the KV cache first, as the vLLM arms decode after their
  prompt), which are the figures compared. tg64 at depth 0, llama-bench's default and this
  benchmark's peer figure before, is kept beside them.

The arms (vLLM and llama.cpp alike) run in passes; pass p starts at arm p mod n, so no arm is
always first. Then: memory read bandwidth on the same cores, weight bytes per decode token, the
fraction of the bandwidth bound each engine reaches, and a profiled in-process int4 engine's
decode step split into buckets (``omni_ray.bench.decode_profile``).

Other processes may share the cores: the load average and the cores' busy fraction are recorded
before the run, before each arm and after the run; only ratios taken side by side in this one
run are meant to be compared. Writes ``<out>/<UTC timestamp>.json`` and ``<out>/README.md``
(both atomically). Targets are reported as measured, never tuned for.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from omni_ray import envs
from omni_ray.bench.common import ISAS, force_isa
from omni_ray.engine.launch import launch_arm
from omni_ray.errors import UserError
from omni_ray.measure.cpuload import check_idle
from omni_ray.models.build import ensure_model, get_shape
from omni_ray.peers import llamacpp
from omni_ray.results.provenance import collect
from omni_ray.results.record import make_record
from omni_ray.results.store import write_json_atomic, write_text_atomic
from omni_ray.results.summary import hardware

SCHEMA_VERSION = 1
KIND = "int4_peers"
GROUP_SIZE = 128
PROMPT_LENS = (128, 512)
OUTPUT_LEN = 64
STAGE = {"kv_cache_mib": 256, "max_model_len": 1024, "multiprocessing": False}
# Token ids in and out, as llama-bench measures (it never detokenizes); what detokenizing costs a
# decode step is measured by ``step_ab --switch detokenize``.
WORKLOAD = {"output_len": OUTPUT_LEN, "batch": 1, "warmup": 1, "repeats": 3, "detokenize": False}
LLAMA_TYPES = ("bf16", "Q4_0")
# llama-bench's decode runs after this many tokens: 0 (its default) and each vLLM prompt length.
LLAMA_DEPTHS = (0, *PROMPT_LENS)
TARGETS = {"int4_vs_vllm_bf16_decode": 2.5, "int4_vs_llamacpp_q4_0_decode": 1.0}


# ------------------------------------------------------------------------------- artifacts


def _run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        raise UserError(f"{cmd[2] if len(cmd) > 2 else cmd[0]} failed (exit {rc}); see {log}")


def _current_checkpoint(int4: Path) -> bool:
    """A finished checkpoint whose config is what ``omni-ray quantize`` writes today (a changed
    default such as row_threshold means quantizing again)."""
    from vllm_omni.quantization.cpu_int4 import DEFAULT_ROW_THRESHOLD

    if not (int4 / "omni_quantize.json").is_file():
        return False
    qc = json.loads((int4 / "config.json").read_text()).get("quantization_config", {})
    return qc.get("row_threshold") == DEFAULT_ROW_THRESHOLD


def ensure_int4(shape: str, work: Path) -> tuple[Path, Path]:
    """(the bf16 model, its cpu_int4 g128 checkpoint under ``work``), quantized once."""
    model = ensure_model(shape)
    art = work / model.name
    int4 = art / f"cpu_int4-g{GROUP_SIZE}"
    quantize_cmd = [sys.executable, "-m", "omni_ray.cli", "quantize", str(model), str(int4),
                    "--group-size", str(GROUP_SIZE), "--overwrite"]
    if not _current_checkpoint(int4):
        _run(quantize_cmd, art / "quantize.log")
    return model, int4


def ensure_ggufs(model: Path, art: Path) -> dict[str, Path]:
    """``model``'s bf16 and Q4_0 GGUFs under ``art`` (converted, then quantized, once)."""
    gguf = {"bf16": art / "model-bf16.gguf", "Q4_0": art / "model-Q4_0.gguf"}
    if not gguf["bf16"].is_file():
        llamacpp.convert(model, gguf["bf16"], "bf16")
    if not gguf["Q4_0"].is_file():
        llamacpp.quantize(gguf["bf16"], gguf["Q4_0"], "Q4_0")
    return gguf


def prepare(shape: str, work: Path) -> dict:
    """The bf16 model, its cpu_int4 checkpoint and its two GGUFs (each built once, then reused)."""
    model, int4 = ensure_int4(shape, work)
    record = json.loads((int4 / "omni_quantize.json").read_text())
    gguf = ensure_ggufs(model, int4.parent)
    return {"model": str(model), "int4": str(int4),
            "quantize_command": ["omni-ray", "quantize", str(model), str(int4),
                                 "--group-size", str(GROUP_SIZE)],
            "quantize_record": {k: record.get(k) for k in
                                ("created", "source_hash", "quantization_config",
                                 "quantized_modules", "ignored_modules", "tied_head_dropped")},
            "int4_bytes_on_disk": _dir_bytes(int4, "*.safetensors"),
            "bf16_bytes_on_disk": _dir_bytes(model, "*.safetensors"),
            "gguf": {k: {"path": str(p), "bytes": p.stat().st_size,
                         "tensor_types": gguf_tensor_types(p)} for k, p in gguf.items()}}


def _dir_bytes(d: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in Path(d).glob(pattern))


def gguf_tensor_types(path: Path) -> dict[str, dict[str, int]]:
    """{ggml type: {"tensors": count, "bytes": total}} read with llama.cpp's own gguf-py."""
    try:
        src = llamacpp.ensure_source()
        sys.path.insert(0, str(src / "gguf-py"))
        from gguf import GGUFReader

        out: dict[str, dict[str, int]] = {}
        for t in GGUFReader(str(path)).tensors:
            d = out.setdefault(t.tensor_type.name, {"tensors": 0, "bytes": 0})
            d["tensors"] += 1
            d["bytes"] += int(t.n_bytes)
        return out
    except Exception as exc:  # noqa: BLE001 - informative only
        return {"error": {"message": repr(exc)}}  # type: ignore[dict-item]


# -------------------------------------------------------------------------------------- arms


def arm_table(art: dict, stage_env: dict[str, str] | None = None,
              cpp_wrapper: bool = False, serial_kernels: bool = False) -> list[dict]:
    """The arms of one pass; ``stage_env`` goes to every vLLM arm's engine (``--stage-env``),
    ``cpp_wrapper`` and ``serial_kernels`` to every compiled one (``--cpp-wrapper``,
    ``--serial-kernels``; eager arms compile nothing)."""
    stage = dict(STAGE, env=dict(stage_env)) if stage_env else STAGE
    if cpp_wrapper:
        stage = dict(stage, cpp_wrapper=True)
    if serial_kernels:
        stage = dict(stage, serial_kernels=True)
    arms = []
    for weights in ("bf16", "int4"):
        for mode in ("eager", "compiled"):
            for plen in PROMPT_LENS:
                arms.append({
                    "id": f"vllm-{weights}-{mode}-p{plen}", "engine": "vllm",
                    "weights": weights, "mode": mode, "prompt_len": plen,
                    "model": art["model"] if weights == "bf16" else art["int4"],
                    "stage": dict(stage, enforce_eager=(mode == "eager"), quantization=None),
                    "workload": dict(WORKLOAD, prompt_len=plen)})
    for qtype in LLAMA_TYPES:
        arms.append({"id": f"llamacpp-{qtype}", "engine": "llama.cpp", "weights": qtype,
                     "gguf": art["gguf"][qtype]["path"]})
    return arms


def pass_order(n: int, pass_no: int) -> list[int]:
    """Pass p (from 1) starts at arm (p - 1) mod n and wraps."""
    start = (pass_no - 1) % n
    return [(start + i) % n for i in range(n)]


def load_now(cpus: list[int]) -> dict:
    check = check_idle(cpus, window_s=0.5)
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpu_busy": check.to_dict()}


def run_vllm_arm(arm: dict, cpus: list[int], node: int | None, work: Path, name: str,
                 timeout_s: float) -> dict:
    req = {"model": arm["model"], "stage": arm["stage"], "workload": arm["workload"],
           "cpus": cpus, "node": node, "seed": 0}
    return launch_arm(req, work, name, timeout_s=timeout_s)


def run_llama_arm(arm: dict, cpus: list[int], timeout_s: float) -> dict:
    """Prefill tests from an empty cache, then decode tests at each of ``LLAMA_DEPTHS``, each
    test with every setting llama.cpp's users tune (``-fa on/off``, the slot's thread counts):
    its figure is the fastest, and ``<figure>_setting`` says which setting that was."""
    common = {"repetitions": 3, "cpus": cpus, "timeout": timeout_s}
    try:
        records = (llamacpp.bench_best(arm["gguf"], n_prompt=PROMPT_LENS, n_gen=0, **common)
                   + llamacpp.bench_best(arm["gguf"], n_prompt=(0,), n_gen=OUTPUT_LEN,
                                         n_depth=LLAMA_DEPTHS, **common))
    except UserError as exc:
        return {"status": "failed", "error": str(exc)}
    return {"status": "ok", "measurements": llama_measurements(records), "records": records}


def llama_measurements(best: list[dict]) -> dict:
    """``{"tg64_d128_tok_s": 31.0, "tg64_d128_tok_s_setting": "-fa on -t 2", ...}``."""
    out: dict = {}
    for r in best:
        out[llama_key(r)] = r["avg_ts"]
        out[llama_key(r) + "_setting"] = r.get("setting_label")
    return out


def llama_key(record: dict) -> str:
    """``pp128_tok_s``, ``tg64_tok_s`` (depth 0), ``tg64_d128_tok_s`` (depth 128)."""
    test = (f"pp{record['n_prompt']}" if record["kind"] == "pp" else
            f"tg{record['n_gen']}" if record["kind"] == "tg" else
            f"pg{record['n_prompt']}_{record['n_gen']}")
    depth = record.get("n_depth") or 0
    return f"{test}{f'_d{depth}' if depth else ''}_tok_s"


# --------------------------------------------------------------------------------- summary


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread_pct(values: list) -> float | None:
    values = [v for v in values if v is not None]
    if len(values) < 2 or not statistics.median(values):
        return None
    return (max(values) - min(values)) / statistics.median(values) * 100


def summarize(records: list[dict]) -> dict:
    """Per arm: median over passes of each figure, with its spread (max-min over median, %)."""
    by_arm: dict[str, list[dict]] = {}
    for r in records:
        if r["status"] == "ok":
            by_arm.setdefault(r["arm"]["id"], []).append(r["measurements"])
    out = {}
    for arm_id, ms in by_arm.items():
        keys = [k for k in ms[0] if isinstance(ms[0][k], (int, float)) and
                not isinstance(ms[0][k], bool)]
        out[arm_id] = {"passes": len(ms)}
        for k in keys:
            vals = [m.get(k) for m in ms]
            out[arm_id][k] = _median(vals)
            out[arm_id][k + "_spread_pct"] = _spread_pct(vals)
        for k in (k for k in ms[0] if k.endswith("_setting")):
            # the setting that won each pass (a peer's best; they may differ between passes)
            out[arm_id][k] = [m.get(k) for m in ms]
    return out


def engine_table(summary: dict) -> dict:
    """One row per engine: decode, prefill 128/512, memory (vLLM: memory pooled over both arms)."""
    rows = {}
    for weights in ("bf16", "int4"):
        for mode in ("eager", "compiled"):
            a = summary.get(f"vllm-{weights}-{mode}-p128", {})
            b = summary.get(f"vllm-{weights}-{mode}-p512", {})
            rows[f"vllm-{weights}-{mode}"] = {
                "decode_tok_s": a.get("decode_tok_s"),
                "decode_spread_pct": a.get("decode_tok_s_spread_pct"),
                "decode_tok_s_at_p512": b.get("decode_tok_s"),
                "prefill128_tok_s": a.get("prefill_tok_s"),
                "prefill512_tok_s": b.get("prefill_tok_s"),
                "rss_anon_tree_mb": _median([a.get("rss_anon_tree_mb"), b.get("rss_anon_tree_mb")]),
                "peak_rss_anon_during_load_mb": _median(
                    [a.get("peak_rss_anon_during_load_mb"), b.get("peak_rss_anon_during_load_mb")]),
                "peak_rss_anon_mb": _median([a.get("peak_rss_anon_mb"), b.get("peak_rss_anon_mb")]),
                "init_s": _median([a.get("init_s"), b.get("init_s")]),
                "kv_cache_tokens": a.get("kv_cache_tokens")}
    p128, p512 = PROMPT_LENS
    tg = f"tg{OUTPUT_LEN}"
    for qtype in LLAMA_TYPES:
        s = summary.get(f"llamacpp-{qtype}", {})
        rows[f"llamacpp-{qtype}"] = {
            # decode after as many tokens as the vLLM arms' prompts: depth 128 and 512
            "decode_tok_s": s.get(f"{tg}_d{p128}_tok_s"),
            "decode_spread_pct": s.get(f"{tg}_d{p128}_tok_s_spread_pct"),
            "decode_tok_s_at_p512": s.get(f"{tg}_d{p512}_tok_s"),
            "decode_tok_s_at_depth0": s.get(f"{tg}_tok_s"),
            "prefill128_tok_s": s.get("pp128_tok_s"), "prefill512_tok_s": s.get("pp512_tok_s"),
            "decode_setting": s.get(f"{tg}_d{p128}_tok_s_setting"),
            "decode_setting_at_p512": s.get(f"{tg}_d{p512}_tok_s_setting")}
    return rows


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def ratios(rows: dict) -> dict:
    out: dict = {}
    q4 = rows.get("llamacpp-Q4_0", {})
    lbf = rows.get("llamacpp-bf16", {})
    for mode in ("eager", "compiled"):
        i4, bf = rows.get(f"vllm-int4-{mode}", {}), rows.get(f"vllm-bf16-{mode}", {})
        r = {}
        for fig in ("decode_tok_s", "decode_tok_s_at_p512", "prefill128_tok_s",
                    "prefill512_tok_s"):
            r[f"{fig}_vs_vllm_bf16_{mode}"] = _ratio(i4.get(fig), bf.get(fig))
            r[f"{fig}_vs_llamacpp_q4_0"] = _ratio(i4.get(fig), q4.get(fig))
            r[f"{fig}_vs_llamacpp_bf16"] = _ratio(i4.get(fig), lbf.get(fig))
        # against llama-bench's default tg64, decoded from an empty cache (the old peer figure)
        r["decode_tok_s_vs_llamacpp_q4_0_at_depth0"] = _ratio(
            i4.get("decode_tok_s"), q4.get("decode_tok_s_at_depth0"))
        pi4, pbf = i4.get("peak_rss_anon_during_load_mb"), bf.get("peak_rss_anon_during_load_mb")
        r["peak_during_load_int4_mb"] = pi4
        r["peak_during_load_bf16_mb"] = pbf
        r["peak_during_load_int4_below_bf16"] = (pi4 < pbf) if pi4 and pbf else None
        r["settled_rss_int4_vs_bf16"] = _ratio(i4.get("rss_anon_tree_mb"),
                                               bf.get("rss_anon_tree_mb"))
        out[f"int4_{mode}"] = r
    best = {w: max((rows.get(f"vllm-{w}-{m}", {}).get("decode_tok_s") or 0
                    for m in ("eager", "compiled")), default=0) for w in ("bf16", "int4")}
    out["best_int4_decode_vs_best_vllm_bf16"] = _ratio(best["int4"], best["bf16"])
    out["best_int4_decode_vs_llamacpp_q4_0"] = _ratio(best["int4"], q4.get("decode_tok_s"))
    out["best_int4_decode_vs_llamacpp_q4_0_at_depth0"] = _ratio(
        best["int4"], q4.get("decode_tok_s_at_depth0"))
    out["targets"] = {
        "int4_vs_vllm_bf16_decode": {"target": TARGETS["int4_vs_vllm_bf16_decode"],
                                     "measured": out["best_int4_decode_vs_best_vllm_bf16"]},
        "int4_vs_llamacpp_q4_0_decode": {"target": TARGETS["int4_vs_llamacpp_q4_0_decode"],
                                         "measured": out["best_int4_decode_vs_llamacpp_q4_0"]}}
    for t in out["targets"].values():
        t["met"] = t["measured"] >= t["target"] if t["measured"] else None
    return out


def ratios_by_pass(records: list[dict]) -> dict[str, dict[int, float | None]]:
    """Decode at prompt 128 of each int4 mode over llama.cpp Q4_0's (depth 128), pass by pass:
    the two arms of one pass ran minutes apart, so this shows how far the median can be trusted."""
    by_pass: dict[int, dict[str, float]] = {}
    for r in records:
        if r["status"] != "ok":
            continue
        m = r["measurements"]
        fig = m.get("decode_tok_s") if "decode_tok_s" in m else m.get(
            f"tg{OUTPUT_LEN}_d{PROMPT_LENS[0]}_tok_s")
        by_pass.setdefault(r["pass"], {})[r["arm"]["id"]] = fig
    out: dict[str, dict[int, float | None]] = {}
    for mode in ("eager", "compiled"):
        out[f"int4_{mode}"] = {p: _ratio(arms.get(f"vllm-int4-{mode}-p{PROMPT_LENS[0]}"),
                                         arms.get("llamacpp-Q4_0"))
                               for p, arms in sorted(by_pass.items())}
    return out


def speed_of_light(rows: dict, shape_name: str, art: dict, bandwidth: dict | None) -> dict:
    """Each engine's decode against the bound of its regime (``speed_of_light.regime_bound``).

    ``bandwidth``: a ``measure.bandwidth --regimes`` result (its ``regimes`` probes and ``llc``);
    an older one without them gives no regime, and fractions against its one DRAM-sized probe.
    """
    from omni_ray.measure.speed_of_light import bytes_per_token, regime_bound
    from omni_ray.measure.regime import DRAM_BOUND

    shape = get_shape(shape_name)
    bpt = {"vllm-bf16": bytes_per_token(shape, "bf16"),
           "vllm-int4": bytes_per_token(shape, "int4", GROUP_SIZE)}
    for qtype in LLAMA_TYPES:
        # every tensor of the GGUF is read once a token (a tied token_embd is the output head)
        bpt[f"llamacpp-{qtype}"] = {"total": art["gguf"][qtype]["bytes"]}
    bandwidth = bandwidth or {}
    probes = bandwidth.get("regimes") or ({DRAM_BOUND: bandwidth} if bandwidth else {})
    llc_bytes = (bandwidth.get("llc") or {}).get("bytes_for_cpus")
    bw = bandwidth.get("ceiling_gb_s")
    out = {"bandwidth_gb_s": bw, "llc_bytes": llc_bytes, "bytes_per_token": bpt,
           "probes": {k: {"size_bytes": v.get("size_bytes"), "ceiling_gb_s": v.get("ceiling_gb_s")}
                      for k, v in probes.items()},
           "engines": {}}
    for name, row in rows.items():
        key = name if name.startswith("llamacpp") else name.rsplit("-", 1)[0]
        out["engines"][name] = regime_bound(row.get("decode_tok_s"), bpt[key]["total"],
                                            llc_bytes, probes)
    return out


def profile_bandwidth(profile: dict | None, shape_name: str, bw: float | None) -> dict | None:
    """GB/s the int4 GEMMs and the head GEMM reach inside the profiled decode step."""
    from omni_ray.measure.speed_of_light import bytes_per_token

    if not profile or profile.get("status") != "ok":
        return None
    step = profile["per_step_ms"]
    b = bytes_per_token(get_shape(shape_name), "int4", GROUP_SIZE)
    out = {}
    for key, nbytes, ms in (("int4_gemm", b["linear"], step.get("int4_gemm_ms")),
                            ("lm_head_gemm", b["head"], step.get("lm_head_gemm_ms"))):
        gb_s = nbytes / (ms / 1e3) / 1e9 if ms and ms > 0 else None
        out[key] = {"bytes": nbytes, "ms": ms, "gb_s": gb_s,
                    "fraction_of_bandwidth": gb_s / bw if gb_s and bw else None}
    return out


# ----------------------------------------------------------------------------- children


def measure_bandwidth(cpus: list[int], log: Path) -> dict | None:
    cmd = [sys.executable, "-m", "omni_ray.measure.bandwidth", "--cpus",
           ",".join(map(str, cpus)), "--regimes"]
    env = os.environ | {"OMP_NUM_THREADS": str(len(cpus))}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    log.write_text(done.stderr)
    if done.returncode != 0:
        return {"status": "failed", "error": f"exit {done.returncode}; see {log}"}
    return json.loads(done.stdout.strip().splitlines()[-1]) | {"status": "ok"}


def run_profile(int4_dir: str, cpus: list[int], node: int | None, work: Path,
                timeout_s: float) -> dict:
    req = {"model": int4_dir, "stage": dict(STAGE, enforce_eager=True), "cpus": cpus,
           "node": node, "profile": {"prompt_len": PROMPT_LENS[0], "output_len": OUTPUT_LEN,
                                     "repeats": 5}}
    req_path, out_path = work / "profile.request.json", work / "profile.result.json"
    write_json_atomic(req_path, req)
    out_path.unlink(missing_ok=True)
    log = work / "profile.log"
    with open(log, "wb") as f:
        try:
            rc = subprocess.run([sys.executable, "-m", "omni_ray.bench.decode_profile",
                                 str(req_path), str(out_path)], stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"no result within {timeout_s:g} s",
                    "log_path": str(log)}
    if not out_path.exists():
        return {"status": "failed", "error": f"exit {rc} without a result", "log_path": str(log)}
    return json.loads(out_path.read_text()) | {"log_path": str(log)}


# ------------------------------------------------------------------------------------ run


def run(args: argparse.Namespace) -> Path:
    t_start = time.monotonic()
    cpus, node = args.cpus, args.node
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    work = args.work_dir or envs.cache_dir() / "bench" / "int4_peers"
    run_dir = work / "runs" / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    command = ["python", "-m", "omni_ray.bench.int4_peers", *sys.argv[1:]]
    provenance = collect()
    before = load_now(cpus)
    _log(f"load before: {before['loadavg']} {before['cpu_busy']['message']}")

    art = prepare(args.shape, work)
    _log(f"artifacts ready ({time.monotonic() - t_start:.0f} s)")
    bandwidth = [measure_bandwidth(cpus, run_dir / "bandwidth-1.log")]
    _log(f"bandwidth: {bandwidth[0].get('ceiling_gb_s')} GB/s")

    arms = arm_table(art, args.stage_env, args.cpp_wrapper, args.serial_kernels)
    records: list[dict] = []
    pass_walls = []
    for pass_no in range(1, args.passes + 1):
        if pass_no > 1 and args.max_minutes:
            projected = time.monotonic() - t_start + statistics.mean(pass_walls) + 180
            if projected > args.max_minutes * 60:
                _log(f"pass {pass_no} skipped: would end after --max-minutes {args.max_minutes}")
                break
        t_pass = time.monotonic()
        for i in pass_order(len(arms), pass_no):
            arm = arms[i]
            load = load_now(cpus)
            name = f"p{pass_no}-{arm['id']}"
            t0 = time.monotonic()
            if arm["engine"] == "vllm":
                res = run_vllm_arm(arm, cpus, node, run_dir, name, args.arm_timeout)
            else:
                res = run_llama_arm(arm, cpus, args.arm_timeout)
            rec = make_record(
                kind=f"{KIND}.arm", config={k: v for k, v in arm.items()},
                measurements=res.get("measurements") or {}, status=res["status"],
                error=res.get("error"), stderr_tail=res.get("stderr_tail"),
                pinning=res.get("pinning"), provenance=collect(),
                extra={"arm": {"id": arm["id"], "index": i}, "pass": pass_no,
                       "load_before": load, "wall_s": time.monotonic() - t0,
                       "engine_log": res.get("log"), "log_path": res.get("log_path"),
                       "patch_report": res.get("patch_report"), "kernels": res.get("kernels"),
                       "llama_bench_records": res.get("records")})
            records.append(rec)
            m = rec["measurements"]
            _log(f"pass {pass_no} {arm['id']}: {rec['status']} "
                 # llama.cpp's decode at the vLLM p128 arm's context, as the tables compare it
                 f"decode={_fmt(m.get('decode_tok_s') or m.get('tg64_d128_tok_s'))} "
                 f"prefill={_fmt(m.get('prefill_tok_s') or m.get('pp128_tok_s'))} "
                 f"rss={_fmt(m.get('rss_anon_tree_mb'))} "
                 f"load={load['loadavg'][0]} ({time.monotonic() - t0:.0f} s)"
                 + (f" error={rec['error']}" if rec["error"] else ""))
        pass_walls.append(time.monotonic() - t_pass)

    profile = None
    if not args.no_profile:
        profile = run_profile(art["int4"], cpus, node, run_dir, args.arm_timeout)
        _log(f"profile: {profile.get('status')} {profile.get('error') or ''}")
    bandwidth.append(measure_bandwidth(cpus, run_dir / "bandwidth-2.log"))
    bw_ok = [b for b in bandwidth if b and b.get("status") == "ok"]
    bw_best = max(bw_ok, key=lambda b: b["ceiling_gb_s"]) if bw_ok else None
    after = load_now(cpus)

    summary = summarize(records)
    rows = engine_table(summary)
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "shape": args.shape,
        "command": command, "cpus": cpus, "node": node, "passes_run": len(pass_walls),
        "passes_requested": args.passes, "wall_s": time.monotonic() - t_start,
        "provenance": provenance, "hardware": hardware(provenance),
        "load_before": before, "load_after": after,
        "note": "other processes may have shared the cores; compare only ratios taken side "
                "by side in this one run",
        "settings": {"stage": STAGE, "stage_env": args.stage_env, "isa": args.isa,
                     "cpp_wrapper": args.cpp_wrapper, "serial_kernels": args.serial_kernels,
                     "workload": WORKLOAD,
                     "prompt_lens": PROMPT_LENS,
                     "group_size": GROUP_SIZE, "llama_bench": {"threads": len(cpus),
                     "n_prompt": PROMPT_LENS, "n_gen": OUTPUT_LEN, "n_depth": LLAMA_DEPTHS,
                     "repetitions": 3, "tuned": {
                         "flash_attn": list(llamacpp.TUNED_FLASH_ATTN),
                         "threads": list(llamacpp.thread_candidates(len(cpus))),
                         "rule": "each test's figure is its fastest setting"}}},
        "artifacts": art, "arms": arms,
        "bandwidth": {"runs": bandwidth, "best": bw_best},
        "engines": rows, "ratios": ratios(rows), "ratios_by_pass": ratios_by_pass(records),
        "speed_of_light": speed_of_light(rows, args.shape, art, bw_best),
        "decode_profile": profile,
        "decode_profile_bandwidth": profile_bandwidth(
            profile, args.shape, (bw_best or {}).get("ceiling_gb_s")),
        "summary": summary, "records": records,
    }
    out = Path(args.out)
    path = write_json_atomic(out / f"{stamp}.json", result)
    write_readme(path)
    _log(f"wrote {path} and {out / 'README.md'} ({result['wall_s'] / 60:.1f} min)")
    return path


NOISY_PCT = 8.0


def _noisy_lines(result: dict) -> list[str]:
    """Per-pass values of every figure whose spread is above NOISY_PCT."""
    out = []
    for arm_id, s in result["summary"].items():
        for key, spread in s.items():
            if not key.endswith("_spread_pct") or spread is None or spread <= NOISY_PCT:
                continue
            fig = key[: -len("_spread_pct")]
            if not fig.startswith(("decode_tok_s", "prefill_tok_s", "tg", "pp")):
                continue
            values = [r["measurements"].get(fig) for r in result["records"]
                      if r["arm"]["id"] == arm_id and r["status"] == "ok"]
            out.append(f"- NOISY {arm_id} {fig}: per pass "
                       + ", ".join(_fmt(v) for v in values) + f" (spread {spread:.0f} %)")
    return [""] + out if out else []


def _fmt(v, nd: int = 1) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v) -> str:
    return "-" if v is None else f"{v * 100:.0f} %"


def _distinct(values: list) -> list[str]:
    return list(dict.fromkeys(str(v) for v in values if v))


def _sol_cell(row: dict) -> str:
    """``"87 % of cache probe (8 MiB buffer), cache-resident"``; the regime is always named."""
    if not row or row.get("fraction") is None:
        return "-"
    if not row.get("bandwidth_probe"):  # a result from before regimes: its one ceiling
        return _pct(row["fraction"])
    text = row.get("fraction_text") or _pct(row["fraction"])
    return f"{text} of {row['bandwidth_probe']}, {row.get('regime') or 'no regime'}"


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def readme(result: dict, json_name: str) -> str:
    rows, r, sol = result["engines"], result["ratios"], result["speed_of_light"]
    prov = result["provenance"]
    lines = [
        "# int4 vs peers: decode, prefill, memory (issue #3)", "",
        f"Result: `{json_name}` (shape `{result['shape']}`, CPUs {result['cpus']}, batch 1, "
        f"{result['passes_run']} pass(es), git {str(prov['git'].get('sha'))[:12]}"
        f"{' dirty' if prov['git'].get('dirty') else ''}).", "",
        f"CPU: {hardware(prov)}.", "",
        "Command:", "", "```",
        ".venv/bin/python -m omni_ray.bench.int4_peers " + " ".join(result["command"][3:]),
        "```", "",
        f"Load average before {result['load_before']['loadavg']}, after "
        f"{result['load_after']['loadavg']}. Other processes may have shared the cores: the "
        "ratios taken side by side in this one run are what counts, not the absolute numbers.",
        "", "Decode: output 64 by difference, prompt 128 (the p512 arm's figure beside it); "
        "llama.cpp: tg64 with 128 (and 512) tokens in its KV cache first (`-d`), as the vLLM "
        "arms decode after their prompt; tg64 from an empty cache, llama-bench's default, in its "
        "own column. Median over passes, (spread = (max - min) / median); "
        f"NOISY: spread above {NOISY_PCT:g} %.", "",
        "| engine | decode tok/s (spread) | decode at p512 | decode at depth 0 | "
        "prefill 128 tok/s | prefill 512 tok/s | RssAnon settled MB | peak during load MB | "
        "speed of light |",
        "|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        spread = row.get("decode_spread_pct")
        noisy = " NOISY" if spread is not None and spread > NOISY_PCT else ""
        lines.append(
            f"| {name} | {_fmt(row.get('decode_tok_s'))}"
            f"{f' ({spread:.0f} %{noisy})' if spread is not None else ''} | "
            f"{_fmt(row.get('decode_tok_s_at_p512'))} | "
            f"{_fmt(row.get('decode_tok_s_at_depth0'))} | "
            f"{_fmt(row.get('prefill128_tok_s'), 0)} | {_fmt(row.get('prefill512_tok_s'), 0)} | "
            f"{_fmt(row.get('rss_anon_tree_mb'), 0)} | "
            f"{_fmt(row.get('peak_rss_anon_during_load_mb'), 0)} | "
            f"{_sol_cell(sol['engines'].get(name, {}))} |")
    lines += _noisy_lines(result)
    for name, row in rows.items():
        if row.get("decode_setting"):
            lines.append(f"- {name}: best of `-fa on/off` x threads per test; decode at depth "
                         f"128 won with `{', '.join(_distinct(row['decode_setting']))}`, at 512 "
                         f"with `{', '.join(_distinct(row.get('decode_setting_at_p512') or []))}`"
                         " (per pass)")
    lines += ["", "Ratios (int4 over the peer):", "",
              "| int4 mode | decode vs vLLM bf16 | (at p512) | decode vs llama.cpp Q4_0 | "
              "(at p512) | (Q4_0 at depth 0) | prefill128 vs vLLM bf16 | prefill512 vs vLLM bf16 | "
              "prefill128 vs Q4_0 | prefill512 vs Q4_0 | peak during load int4 < bf16 |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode in ("eager", "compiled"):
        m = r[f"int4_{mode}"]
        i4, bf = rows.get(f"vllm-int4-{mode}", {}), rows.get(f"vllm-bf16-{mode}", {})
        noisy = " NOISY" if any((x.get("decode_spread_pct") or 0) > NOISY_PCT
                                for x in (i4, bf)) else ""
        lines.append(
            f"| {mode} | {_x(m[f'decode_tok_s_vs_vllm_bf16_{mode}'])}{noisy} | "
            f"{_x(m.get(f'decode_tok_s_at_p512_vs_vllm_bf16_{mode}'))} | "
            f"{_x(m['decode_tok_s_vs_llamacpp_q4_0'])} | "
            f"{_x(m.get('decode_tok_s_at_p512_vs_llamacpp_q4_0'))} | "
            f"{_x(m.get('decode_tok_s_vs_llamacpp_q4_0_at_depth0'))} | "
            f"{_x(m[f'prefill128_tok_s_vs_vllm_bf16_{mode}'])} | "
            f"{_x(m[f'prefill512_tok_s_vs_vllm_bf16_{mode}'])} | "
            f"{_x(m['prefill128_tok_s_vs_llamacpp_q4_0'])} | "
            f"{_x(m['prefill512_tok_s_vs_llamacpp_q4_0'])} | "
            f"{m['peak_during_load_int4_below_bf16']} "
            f"({_fmt(m['peak_during_load_int4_mb'], 0)} vs "
            f"{_fmt(m['peak_during_load_bf16_mb'], 0)}) |")
    lines += [""]
    for mode, per_pass in (result.get("ratios_by_pass") or {}).items():
        lines.append(f"- {mode} decode vs llama.cpp Q4_0 by pass: "
                     + ", ".join(f"{_x(v)} (pass {p})" for p, v in per_pass.items()))
    noisy_rows = [n for n, row in rows.items() if (row.get("decode_spread_pct") or 0) > NOISY_PCT]
    for name, t in r["targets"].items():
        lines.append(f"- target {name} >= {t['target']}: measured {_x(t['measured'])} "
                     f"({'met' if t['met'] else 'NOT met' if t['met'] is not None else 'n/a'}), "
                     "best mode of each engine"
                     + (f"; NOISY decode in {', '.join(noisy_rows)}" if noisy_rows else ""))
    bw = result["bandwidth"]["best"] or {}
    lines += ["", f"Speed of light: best measured bandwidth on CPUs {result['cpus']} "
              f"{_fmt(bw.get('ceiling_gb_s'), 2)} GB/s (sum bf16 "
              f"{_fmt(bw.get('sum_bf16_gb_s'), 2)}, sum fp32 {_fmt(bw.get('sum_fp32_gb_s'), 2)}, "
              "copy read+write "
              f"{_fmt(bw.get('copy_gb_s'), 2)}); weight bytes per token: "
              + ", ".join(f"{k} {v['total'] / 1e6:.0f} MB" for k, v in
                          sol["bytes_per_token"].items())
              + ". Fraction = decode tok/s x bytes per token / bandwidth (KV reads ignored), "
              "against the probe of the figure's regime: "
              + (", ".join(f"{k} {_fmt(v.get('ceiling_gb_s'), 2)} GB/s over "
                           f"{(v.get('size_bytes') or 0) / 2**20:g} MiB"
                           for k, v in (sol.get("probes") or {}).items()) or "-")
              + f" (LLC {_fmt((sol.get('llc_bytes') or 0) / 2**20, 0)} MiB from sysfs)."]
    prof = result.get("decode_profile")
    if prof and prof.get("status") == "ok":
        s = dict(prof["per_step_ms"])
        s["outside_model_ms"] = (s["profiled_wall_ms"] - s["model_forward_ms"]
                                 - s["lm_head_logits_ms"] - s["sampling_ms"])
        s["profiler_overhead_ms"] = s["profiled_wall_ms"] - s["wall_ms"]
        pb = result.get("decode_profile_bandwidth") or {}
        lines += ["", "int4 decode step (eager, in-process, torch.profiler, by difference of "
                  f"{prof['output_len']}- and 1-token runs at prompt {prof['prompt_len']}; "
                  "inclusive CPU time, the buckets add up to the profiled wall):", "",
                  "| bucket | ms/step |", "|---|---|"]
        for key, label in (("int4_gemm_ms", "int4 GEMMs (cpu_int4_linear, layers)"),
                           ("attention_ms", "attention"),
                           ("lm_head_logits_ms", "lm_head + logits"),
                           ("sampling_ms", "sampling"),
                           ("other_model_ops_ms", "other model ops (norms, RoPE, SiLU, adds)"),
                           ("outside_model_ms", "vLLM per-step overhead (profiled wall - "
                                                "model - logits - sampling)"),
                           ("profiled_wall_ms", "wall per step (profiled)"),
                           ("wall_ms", "wall per step (unprofiled, median)"),
                           ("profiler_overhead_ms", "of which profiler overhead")):
            lines.append(f"| {label} | {_fmt(s.get(key), 2)} |")
        g = pb.get("int4_gemm") or {}
        h = pb.get("lm_head_gemm") or {}
        lines += ["", f"The layers' int4 GEMMs read {g.get('bytes', 0) / 1e6:.0f} MB in "
                  f"{_fmt(g.get('ms'), 2)} ms ({_fmt(g.get('gb_s'), 1)} GB/s, "
                  f"{_pct(g.get('fraction_of_bandwidth'))} of the bandwidth); the head GEMM "
                  f"{h.get('bytes', 0) / 1e6:.0f} MB in {_fmt(h.get('ms'), 2)} ms "
                  f"({_fmt(h.get('gb_s'), 1)} GB/s)."]
    lines.append("")
    return "\n".join(lines)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") \
            from None


def _env_pair(text: str) -> tuple[str, str]:
    """NAME=VALUE, the name checked as a sweep's ``stage.env`` is (a valid name, not one a typed
    stage field owns)."""
    from omni_ray.config import fields

    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        fields.env({name: value}, fields.Where("--stage-env", "."))
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m omni_ray.bench.int4_peers",
                                description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-0.5b", help="synthetic model shape")
    p.add_argument("--out", default="results/int4", help="directory for <timestamp>.json")
    p.add_argument("--cpus", type=_int_list, default=[0, 1])
    p.add_argument("--node", type=int, default=0, help="NUMA node to bind memory to")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--max-minutes", type=float, default=40.0,
                   help="start another pass only if it should end within this (0: no limit)")
    p.add_argument("--arm-timeout", type=float, default=900.0)
    p.add_argument("--work-dir", type=Path, default=None,
                   help="artifacts and logs (default $OMNI_RAY_CACHE/bench/int4_peers)")
    p.add_argument("--stage-env", type=_env_pair, action="append", default=[],
                   metavar="NAME=VALUE", help="environment of every vLLM arm's engine (repeat); "
                   "e.g. OMP_WAIT_POLICY=ACTIVE, as llama-bench's threads poll for work")
    p.add_argument("--cpp-wrapper", action="store_true",
                   help="compiled vLLM arms (bf16 and int4 alike) use inductor's C++ wrapper "
                        "(stage.cpp_wrapper)")
    p.add_argument("--serial-kernels", action="store_true",
                   help="compiled vLLM arms run inductor's kernels without OpenMP regions "
                        "(stage.serial_kernels)")
    p.add_argument("--isa", choices=ISAS, default="native",
                   help="avx2: vllm_omni's and torch's AVX2 kernels in the vLLM arms and an "
                        "AVX2-only llama.cpp, as an AVX2-only CPU runs them (bench/common.py)")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--readme-from", type=Path, default=None, metavar="RESULT.json",
                   help="only rewrite README.md beside RESULT.json from it (no benchmark)")
    return p


def write_readme(result_path: Path) -> Path:
    result = json.loads(Path(result_path).read_text())
    return write_text_atomic(Path(result_path).parent / "README.md",
                             readme(result, Path(result_path).name))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.stage_env = {**force_isa(args.isa), **dict(args.stage_env)}
    if args.passes < 1:
        print("int4_peers: error: --passes must be >= 1", file=sys.stderr)
        return 2
    try:
        if args.readme_from:
            print(write_readme(args.readme_from))
        else:
            run(args)
    except UserError as exc:
        print(f"int4_peers: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
