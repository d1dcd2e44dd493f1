"""The decode regime and the CPU in a sweep's summary."""

from omni_ray.results.summary import hardware, summarize_arms, to_markdown

PROV = {"cpu": {"brand": "AMD EPYC 9R45 (Zen 5)",
                "flags": ["avx2", "avx512f", "avx512vnni", "avx512_bf16", "sse4_2"]},
        "llc": {"level": 3, "size_bytes": 32 << 20, "instances": ["0-1"],
                "total_bytes": 32 << 20, "source": "sysfs"}}
EPYC = "AMD EPYC 9R45 (Zen 5); ISA avx512_bf16 avx512_vnni avx512f; LLC 32 MiB L3 x1 (CPUs 0-1)"


def rec(arm, tok_s, regime):
    return {"arm": {"id": arm}, "status": "ok", "provenance": PROV,
            "measurements": {"decode_tok_s": tok_s, "decode_regime": regime,
                             "decode_weight_bytes_per_token": 1, "llc_bytes": 32 << 20}}


def test_hardware_names_model_isa_and_llc():
    assert hardware(PROV) == EPYC
    assert hardware({}) is None
    assert hardware({"cpu": {"brand": "Old", "flags": ["sse2"]}}) == (
        "Old; ISA no AVX-512/AMX; LLC unknown")
    assert hardware({"cpu": {"brand": "AMD EPYC", "family": 26, "model": 2}}).startswith(
        "AMD EPYC (family 26 model 2); ")


def test_each_arm_carries_its_regime_and_the_markdown_names_them():
    s = summarize_arms([rec("tiny", 900.0, "cache-resident"), rec("tiny", 910.0, "cache-resident"),
                        rec("qwen", 20.0, "DRAM-bound"), rec("qwen", 21.0, "DRAM-bound")],
                       ["decode_tok_s"])
    assert s["arms"]["tiny"]["decode_regime"] == ["cache-resident"]
    assert s["arms"]["qwen"]["decode_regime"] == ["DRAM-bound"]
    assert s["hardware"] == [EPYC] and s["arms"]["qwen"]["hardware"] == [EPYC]
    md = to_markdown(s)
    assert "| arm | decode_tok_s | decode regime | n | flags |" in md
    assert "| tiny | 905 (1.1%) | cache-resident | 2 |" in md
    assert "| qwen | 20.5 (4.9%) | DRAM-bound | 2 |" in md
    assert f"CPU: {EPYC}\n" in md


def test_without_regimes_the_table_is_as_before():
    r = {"arm": {"id": "a"}, "status": "ok", "measurements": {"ready_s": 1.0}}
    md = to_markdown(summarize_arms([r], ["ready_s"]))
    assert md.splitlines()[0] == "| arm | ready_s | n | flags |"
    assert "CPU:" not in md
