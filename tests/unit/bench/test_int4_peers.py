"""int4_peers without engines: pass order, byte counts, ratios, speed-of-light and the README."""

import argparse

import pytest

from omni_ray.bench import int4_peers
from omni_ray.bench.speed_of_light import bytes_per_token, fraction, int4_linear_bytes
from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND
from omni_ray.models.shapes import SHAPES

MiB = 1 << 20
SOL_LLC = 32 * MiB
SOL_PROBES = {DRAM_BOUND: {"ceiling_gb_s": 40.0, "size_bytes": 1024 * MiB},
              CACHE_RESIDENT: {"ceiling_gb_s": 200.0, "size_bytes": 8 * MiB}}


def test_pass_order_rotates_so_no_arm_is_always_first():
    firsts = {int4_peers.pass_order(10, p)[0] for p in range(1, 11)}
    assert firsts == set(range(10))
    assert sorted(int4_peers.pass_order(10, 3)) == list(range(10))


def test_bf16_bytes_per_token_is_two_bytes_a_parameter_for_a_tied_model():
    shape = SHAPES["qwen2.5-0.5b"]
    assert bytes_per_token(shape, "bf16")["total"] == 2 * shape.num_parameters()


def test_int4_g128_is_4_25_bits_a_weight_plus_bf16_norms():
    shape = SHAPES["qwen2.5-0.5b"]
    b = bytes_per_token(shape, "int4", 128)
    weights = shape.num_parameters() - (2 * shape.num_layers + 1) * shape.hidden_size
    assert b["linear"] + b["head"] == weights * 4.25 / 8
    assert int4_linear_bytes(256, 256, 128) == 256 * 128 + 256 * 2 * 4


def test_bytes_per_token_rejects_unknown_kind():
    with pytest.raises(ValueError, match="kind must be"):
        bytes_per_token(SHAPES["tiny"], "fp8")


def test_fraction():
    assert fraction(10.0, 1_000_000_000, 20.0) == pytest.approx(0.5)
    assert fraction(None, 1, 20.0) is None


def _rows():
    return {
        "vllm-bf16-eager": {"decode_tok_s": 10.0, "prefill128_tok_s": 1000.0,
                            "prefill512_tok_s": 1200.0, "peak_rss_anon_during_load_mb": 2000.0,
                            "rss_anon_tree_mb": 1500.0},
        "vllm-bf16-compiled": {"decode_tok_s": 12.0, "prefill128_tok_s": 1100.0,
                               "prefill512_tok_s": 1300.0,
                               "peak_rss_anon_during_load_mb": 2100.0, "rss_anon_tree_mb": 1600.0},
        "vllm-int4-eager": {"decode_tok_s": 25.0, "prefill128_tok_s": 900.0,
                            "prefill512_tok_s": 1100.0, "peak_rss_anon_during_load_mb": 1500.0,
                            "rss_anon_tree_mb": 1000.0},
        "vllm-int4-compiled": {"decode_tok_s": 33.0, "prefill128_tok_s": 950.0,
                               "prefill512_tok_s": 1150.0,
                               "peak_rss_anon_during_load_mb": 1600.0, "rss_anon_tree_mb": 1100.0},
        "llamacpp-bf16": {"decode_tok_s": 15.0, "prefill128_tok_s": 500.0,
                          "prefill512_tok_s": 480.0},
        "llamacpp-Q4_0": {"decode_tok_s": 30.0, "decode_tok_s_at_depth0": 33.0,
                          "prefill128_tok_s": 600.0, "prefill512_tok_s": 550.0},
    }


def test_ratios_and_targets():
    r = int4_peers.ratios(_rows())
    assert r["int4_eager"]["decode_tok_s_vs_vllm_bf16_eager"] == pytest.approx(2.5)
    assert r["int4_compiled"]["decode_tok_s_vs_llamacpp_q4_0"] == pytest.approx(1.1)
    assert r["int4_compiled"]["decode_tok_s_vs_llamacpp_q4_0_at_depth0"] == pytest.approx(1.0)
    assert r["best_int4_decode_vs_llamacpp_q4_0_at_depth0"] == pytest.approx(1.0)
    assert r["int4_eager"]["peak_during_load_int4_below_bf16"] is True
    assert r["best_int4_decode_vs_best_vllm_bf16"] == pytest.approx(33 / 12)
    assert r["targets"]["int4_vs_vllm_bf16_decode"]["met"] is True
    assert r["targets"]["int4_vs_llamacpp_q4_0_decode"]["met"] is True


def test_ratios_with_a_missing_arm_are_none_not_a_crash():
    rows = _rows()
    del rows["llamacpp-Q4_0"]
    r = int4_peers.ratios(rows)
    assert r["int4_eager"]["decode_tok_s_vs_llamacpp_q4_0"] is None
    assert r["targets"]["int4_vs_llamacpp_q4_0_decode"]["met"] is None


def _llama_record(kind, n_prompt, n_gen, n_depth, ts, fa=1, threads=2):
    return {"kind": kind, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "avg_ts": ts,
            "flash_attn": fa, "threads": threads}


def test_llama_arm_prefills_from_empty_and_decodes_at_the_vllm_prompt_lengths(monkeypatch):
    calls = []

    def fake_bench(gguf, **kw):
        """Every (-fa, -t) combination; -fa off is faster at depth 0, on deeper in the cache
        (as on CPUs), one thread is slower."""
        calls.append(kw)
        out = []
        for fa in (1, 0):  # llama-bench's JSON: the enum's int
            for t in kw["threads"]:
                slow = 0.5 if t == 1 else 1.0
                if kw["n_gen"] == 0:
                    out += [_llama_record("pp", n, 0, 0, (1000.0 + n) * slow, fa, t)
                            for n in kw["n_prompt"]]
                else:
                    out += [_llama_record("tg", 0, kw["n_gen"], d,
                                          (100.0 - d / 16 + (2 if fa else -2) * (d > 0)
                                           - (1 if fa and d == 0 else 0)) * slow, fa, t)
                            for d in kw["n_depth"]]
        return out

    monkeypatch.setattr(int4_peers.llamacpp, "bench", fake_bench)
    res = int4_peers.run_llama_arm({"gguf": "q.gguf"}, [0, 1], timeout_s=60)
    assert [c.get("n_depth", (0,)) for c in calls] == [(0,), (0, 128, 512)]
    assert all(c["flash_attn"] == ("on", "off") and c["threads"] == (1, 2) for c in calls)
    assert res["measurements"] == {
        "pp128_tok_s": 1128.0, "pp128_tok_s_setting": "-fa on -t 2",
        "pp512_tok_s": 1512.0, "pp512_tok_s_setting": "-fa on -t 2",
        "tg64_tok_s": 100.0, "tg64_tok_s_setting": "-fa off -t 2",
        "tg64_d128_tok_s": 94.0, "tg64_d128_tok_s_setting": "-fa on -t 2",
        "tg64_d512_tok_s": 70.0, "tg64_d512_tok_s_setting": "-fa on -t 2"}
    rows = int4_peers.engine_table(int4_peers.summarize([
        {"arm": {"id": "llamacpp-Q4_0"}, "pass": 1, "status": "ok",
         "measurements": res["measurements"]}]))
    q4 = rows["llamacpp-Q4_0"]
    # the compared figure is the one at the vLLM arm's context, not llama-bench's default
    assert (q4["decode_tok_s"], q4["decode_tok_s_at_p512"], q4["decode_tok_s_at_depth0"]) == (
        94.0, 70.0, 100.0)
    assert q4["prefill128_tok_s"] == 1128.0
    assert q4["decode_setting"] == ["-fa on -t 2"]


def test_ratios_by_pass_pair_each_int4_arm_with_q4_0_of_the_same_pass():
    def rec(p, arm, m):
        return {"arm": {"id": arm}, "pass": p, "status": "ok", "measurements": m}

    records = [rec(1, "vllm-int4-compiled-p128", {"decode_tok_s": 90.0}),
               rec(1, "llamacpp-Q4_0", {"tg64_tok_s": 99.0, "tg64_d128_tok_s": 100.0}),
               rec(2, "vllm-int4-compiled-p128", {"decode_tok_s": 80.0}),
               rec(2, "vllm-int4-compiled-p512", {"decode_tok_s": 70.0}),
               rec(2, "llamacpp-Q4_0", {"tg64_tok_s": 70.0, "tg64_d128_tok_s": 64.0})]
    by_pass = int4_peers.ratios_by_pass(records)
    assert by_pass["int4_compiled"] == {1: pytest.approx(0.9), 2: pytest.approx(1.25)}
    assert by_pass["int4_eager"] == {1: None, 2: None}


def test_summarize_takes_medians_over_ok_passes_only():
    def rec(p, status, decode):
        return {"arm": {"id": "a"}, "pass": p, "status": status,
                "measurements": {"decode_tok_s": decode} if decode else {}}

    s = int4_peers.summarize([rec(1, "ok", 10.0), rec(2, "ok", 12.0), rec(3, "failed", None)])
    assert s["a"]["passes"] == 2
    assert s["a"]["decode_tok_s"] == pytest.approx(11.0)
    assert s["a"]["decode_tok_s_spread_pct"] == pytest.approx(2 / 11 * 100)


def test_speed_of_light_and_readme_render():
    art = {"gguf": {"bf16": {"bytes": 773_000_000}, "Q4_0": {"bytes": 250_000_000}}}
    rows = _rows()
    sol = int4_peers.speed_of_light(rows, "qwen2.5-0.5b", art, {"ceiling_gb_s": 10.0})
    int4 = sol["engines"]["vllm-int4-eager"]
    assert int4["fraction"] == pytest.approx(25.0 * int4["bytes_per_token"] / 10e9)
    result = {
        "engines": rows, "ratios": int4_peers.ratios(rows), "speed_of_light": sol,
        "provenance": {"git": {"sha": "abc", "dirty": False}, "cpu": {"brand": "x"}},
        "shape": "qwen2.5-0.5b", "cpus": [0, 1], "passes_run": 2,
        "command": ["python", "-m", "omni_ray.bench.int4_peers", "--shape", "qwen2.5-0.5b"],
        "load_before": {"loadavg": [0.1, 0.1, 0.1]}, "load_after": {"loadavg": [0.2, 0.1, 0.1]},
        "bandwidth": {"best": {"ceiling_gb_s": 10.0}}, "decode_profile": None,
        "ratios_by_pass": {"int4_compiled": {1: 1.05, 2: 0.86}},
        "summary": {}, "records": []}
    text = int4_peers.readme(result, "x.json")
    assert "| vllm-int4-eager | 25.0 |" in text
    assert "| llamacpp-Q4_0 | 30.0 | - | 33.0 |" in text
    assert "int4_compiled decode vs llama.cpp Q4_0 by pass: 1.05x (pass 1), 0.86x (pass 2)" in text
    assert "--shape qwen2.5-0.5b" in text
    assert "CPU: x; ISA no AVX-512/AMX; LLC unknown." in text


def test_parser_defaults():
    args = int4_peers.build_parser().parse_args([])
    assert args.cpus == [0, 1] and args.passes == 2 and args.shape == "qwen2.5-0.5b"


def test_stage_env_reaches_every_vllm_arm_and_only_those():
    art = {"model": "m", "int4": "q", "gguf": {"bf16": {"path": "a"}, "Q4_0": {"path": "b"}}}
    arms = int4_peers.arm_table(art, {"OMP_WAIT_POLICY": "ACTIVE"})
    vllm = [a for a in arms if a["engine"] == "vllm"]
    assert len(vllm) == 8 and all(a["stage"]["env"] == {"OMP_WAIT_POLICY": "ACTIVE"} for a in vllm)
    assert all("stage" not in a for a in arms if a["engine"] != "vllm")
    assert all("env" not in a["stage"] for a in int4_peers.arm_table(art) if "stage" in a)
    assert dict([int4_peers._env_pair("OMP_WAIT_POLICY=ACTIVE")]) == {"OMP_WAIT_POLICY": "ACTIVE"}
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=VALUE, got 'ACTIVE'"):
        int4_peers._env_pair("ACTIVE")
    # the same checks as a sweep's stage.env
    with pytest.raises(argparse.ArgumentTypeError, match="1X: not an environment variable name"):
        int4_peers._env_pair("1X=2")
    with pytest.raises(argparse.ArgumentTypeError,
                       match="VLLM_OMNI_DISABLE_KV_BUDGET: set by the typed field"):
        int4_peers._env_pair("VLLM_OMNI_DISABLE_KV_BUDGET=1")


def test_cpp_wrapper_reaches_every_vllm_arm_and_the_runner_applies_it_to_compiled_ones():
    from omni_ray.engine.runner import engine_env, engine_kwargs

    art = {"model": "m", "int4": "q", "gguf": {"bf16": {"path": "a"}, "Q4_0": {"path": "b"}}}
    vllm = [a for a in int4_peers.arm_table(art, cpp_wrapper=True) if a["engine"] == "vllm"]
    assert len(vllm) == 8 and all(a["stage"]["cpp_wrapper"] is True for a in vllm)
    applied = {a["id"]: "cpp_wrapper" in engine_kwargs(
        {"model": "tiny", "model_path": "m", "stage": a["stage"]}).get("compilation_config", {}).get(
        "inductor_compile_config", {}) for a in vllm}
    assert applied == {a["id"]: a["mode"] == "compiled" for a in vllm}
    assert int4_peers.build_parser().parse_args(["--cpp-wrapper"]).cpp_wrapper is True


def test_serial_kernels_reach_every_compiled_vllm_arm():
    from omni_ray.engine.runner import engine_kwargs

    art = {"model": "m", "int4": "q", "gguf": {"bf16": {"path": "a"}, "Q4_0": {"path": "b"}}}
    vllm = [a for a in int4_peers.arm_table(art, serial_kernels=True) if a["engine"] == "vllm"]
    applied = {a["id"]: engine_kwargs({"model": "tiny", "model_path": "m", "stage": a["stage"]}).get(
        "compilation_config", {}).get("inductor_compile_config", {}).get("cpp.threads")
        for a in vllm}
    assert applied == {a["id"]: 1 if a["mode"] == "compiled" else None for a in vllm}
    assert int4_peers.build_parser().parse_args(["--serial-kernels"]).serial_kernels is True


def test_int4_peers_rows_name_their_regime_and_probe():
    art = {"gguf": {"bf16": {"bytes": 773_000_000}, "Q4_0": {"bytes": 250_000_000}}}
    rows = {"vllm-int4-eager": {"decode_tok_s": 25.0}, "llamacpp-Q4_0": {"decode_tok_s": 30.0}}
    bw = {"ceiling_gb_s": 40.0, "regimes": SOL_PROBES, "llc": {"bytes_for_cpus": SOL_LLC}}
    sol = int4_peers.speed_of_light(rows, "qwen2.5-0.5b", art, bw)
    assert {r["regime"] for r in sol["engines"].values()} == {DRAM_BOUND}
    assert sol["engines"]["llamacpp-Q4_0"]["bandwidth_gb_s"] == 40.0
    cell = int4_peers._sol_cell(sol["engines"]["llamacpp-Q4_0"])
    assert cell == "19 % of DRAM probe (1024 MiB buffer), DRAM-bound"
    tiny = {"gguf": {"bf16": {"bytes": 3_400_000}, "Q4_0": {"bytes": 1_000_000}}}
    sol = int4_peers.speed_of_light(rows, "tiny", tiny, bw)
    assert sol["engines"]["llamacpp-Q4_0"]["regime"] == CACHE_RESIDENT
