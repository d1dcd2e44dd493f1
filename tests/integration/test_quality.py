"""Quality beside speed on real vLLM (and transformers), the tiny model, a real local Ray.

One sweep with ``workload.quality`` on: a bf16 vLLM arm, a cpu_int4 arm (quantized at load),
a cpu_int4 checkpoint written with the packer's nibble order swapped (even k in the high
nibble, where the format and the loader say low), a transformers bf16 arm, and llama.cpp's bf16
and Q4_0 GGUFs of tiny (omni-logprobs; left out, with a note, where llama.cpp can be neither
found built nor built). Every record carries the probe's figures; the summary pairs both int4
arms with the bf16 vLLM arm and the Q4_0 GGUF with the bf16 GGUF, and the broken packer stands
far outside the working one. The weights are random: only the relation between the figures
means anything (results/quality.CAVEAT)."""

from __future__ import annotations

import math
import shutil

import pytest

import omni_ray
from omni_ray.results.quality import compare

pytestmark = pytest.mark.integration

TOKENS, SEQUENCE_LEN = 32, 128


@pytest.fixture(scope="module")
def swapped_nibbles(tmp_path_factory):
    """A cpu_int4 checkpoint of tiny whose packer puts code k of an even k in the high nibble."""
    import torch

    from omni_ray.models.build import ensure_model
    from vllm_omni.quantization import grid
    from vllm_omni.quantization.convert import quantize_checkpoint

    def swapped(codes):
        c = codes.to(torch.uint8)
        return (c[:, 0::2] << 4) | c[:, 1::2]

    dst = tmp_path_factory.mktemp("quality") / "tiny-int4-swapped"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(grid, "pack_nibbles", swapped)
        quantize_checkpoint(ensure_model("tiny"), dst, group_size=128)
    return dst


def llamacpp_buildable() -> bool:
    from omni_ray.peers import llamacpp

    return llamacpp.is_built() or bool(shutil.which("cmake") and shutil.which("c++"))


@pytest.mark.timeout(1800)
def test_quantized_arms_pair_with_bf16_and_a_swapped_nibble_order_fails(
        local_ray, swapped_nibbles, tmp_path):
    arms = {"engine": ["vllm", "vllm", "vllm", "transformers"],
            "model": ["tiny", "tiny", str(swapped_nibbles), "tiny"],
            "quantization": [None, "cpu_int4", None, None],
            "kv_cache_mib": [32, 32, 32, None]}
    llama = llamacpp_buildable()  # arms 4 and 5: llama.cpp's bf16 and Q4_0 GGUFs of tiny
    if llama:
        for key, values in {"engine": ["llamacpp"] * 2, "model": ["tiny"] * 2,
                            "quantization": [None, "Q4_0"], "kv_cache_mib": [None] * 2}.items():
            arms[key] += values
    else:
        print("\nllama.cpp arms left out: llama.cpp is not built and cmake or c++ is missing")
    cfg = {"name": "quality", "model": "tiny", "passes": 1, "timeout_s": 600,
           "placement": {"slot_cores": 1}, "stage": {"max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 0, "repeats": 1,
                        "detokenize": False,  # llama.cpp's arms measure on token ids only
                        "quality": {"tokens": TOKENS, "sequence_len": SEQUENCE_LEN}},
           "zip": [arms]}
    report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    recs = {r["arm"]["index"]: r for r in report.records}
    assert all(r["status"] == "ok" for r in recs.values()), \
        {i: (r.get("error"), r.get("stderr_tail")) for i, r in recs.items()}
    bf16, int4, broken, hf = (recs[i]["measurements"] for i in range(4))
    for m in (recs[i]["measurements"] for i in sorted(recs)):
        assert len(m["quality_logprobs"]) == SEQUENCE_LEN - 1
        assert len(m["quality_greedy_ids"]) == TOKENS
        assert m["quality_ids_digest"] == bf16["quality_ids_digest"]  # the same ids read
        assert m["prefill_tok_s"] > 0 and "decode_tok_s" in m  # beside its speed (a decode
        # figure may be None on a contended core: t(N) <= t(1), engines.vllm.timing_figures)
    assert [m["quality_weights"] for m in (bf16, int4, broken, hf)] == [
        "bfloat16", "cpu_int4", "cpu_int4", "bfloat16"]
    # the written checkpoint names tiny as its source, so it pairs with tiny's bf16 arm
    assert broken["quality_source"] == bf16["quality_source"]

    ids = {i: recs[i]["arm"]["id"] for i in recs}
    rows = {r["arm"]: r for r in report.summaries["quality"]["quality"]}
    # the bf16 arms are baselines
    assert sorted(rows) == sorted([ids[1], ids[2], *([ids[5]] if llama else [])])
    good, bad = rows[ids[1]], rows[ids[2]]
    assert good["baseline"] == bad["baseline"] == ids[0]
    engines = compare(bf16, hf)
    print(f"\ncpu_int4 vs bf16: {good}\nswapped nibbles vs bf16: {bad}\n"
          f"transformers bf16 vs vLLM bf16: {engines}")
    # Measured on tiny (AMD EPYC Zen 5, docs/quality.md): mean |dlogprob| 0.0705 for cpu_int4,
    # 0.339 with the nibbles swapped, 0.0017 between the two engines' bf16 (kernel rounding).
    # The bounds leave ~2x for another CPU's rounding; the broken packer stays outside them.
    assert good["mean_abs_dlogprob"] < 0.15 < 0.2 < bad["mean_abs_dlogprob"]
    assert good["mean_abs_dlogprob"] < 0.5 * bad["mean_abs_dlogprob"]
    assert abs(math.log(good["perplexity_ratio"])) < 0.01 < abs(math.log(bad["perplexity_ratio"]))
    # the probe means the same on both engines: the same ids, the same log-probabilities
    assert engines["mean_abs_dlogprob"] < 0.02
    # Greedy ids on random weights settle on one repeated id (1132 on tiny, measured) for
    # bf16, cpu_int4 and the swapped packer alike: greedy agreement is reported but does not
    # tell them apart on this model (docs/quality.md); the log-probabilities do.
    for row in (good, bad):
        assert 0 <= row["greedy_agreement"] <= 1 and row["greedy_prefix"] <= TOKENS
    if llama:
        check_llamacpp_arms(recs, ids, rows, bf16)
    (md,) = [p.read_text() for p in (tmp_path / "quality").glob("*/summary.md")]
    assert "## Quality beside speed" in md and "meaningless" in md


def check_llamacpp_arms(recs: dict, ids: dict, rows: dict, vllm_bf16: dict) -> None:
    """llama.cpp's bf16 GGUF reads what vLLM's bf16 reads; its Q4_0 GGUF pairs with it."""
    gguf, q4 = recs[4]["measurements"], recs[5]["measurements"]
    assert [gguf["quality_weights"], q4["quality_weights"]] == ["bfloat16", "Q4_0"]
    assert gguf["quality_source"] == q4["quality_source"] == vllm_bf16["quality_source"]
    runs = recs[5]["engine_report"]["llamacpp"]["runs"]
    assert [r["label"] for r in runs] == ["prefill", "decode", "quality"]
    assert recs[5]["pinning"]["violations"] == []  # the probe ran on the arm's slot too
    row = rows[ids[5]]
    assert row["baseline"] == ids[4]  # the bf16 GGUF of the same engine, not vLLM's bf16
    assert all(math.isfinite(row[k]) for k in ("mean_abs_dlogprob", "max_abs_dlogprob",
                                               "perplexity_ratio", "greedy_agreement"))
    engines = compare(vllm_bf16, gguf)
    print(f"Q4_0 vs bf16 GGUF: {row}\nllama.cpp bf16 vs vLLM bf16: {engines}")
    # Measured on tiny (AMD EPYC, Zen 5, one core, docs/quality.md): Q4_0 vs the bf16 GGUF
    # 0.049 mean |dlogprob| (max 0.148), perplexity ratio 0.9943; llama.cpp's bf16 vs vLLM's
    # bf16 0.0014 (max 0.0068), ratio 1.0001: the same weights, kernel rounding only, the
    # magnitude of transformers vs vLLM (0.0017). The bounds leave 3x and more (7x between
    # engines, for another CPU's or ISA build's rounding); Q4_0 stays under the working
    # cpu_int4's bound, far from the swapped packer's 0.34 and 6 %.
    assert 0 < row["mean_abs_dlogprob"] < 0.15
    assert abs(math.log(row["perplexity_ratio"])) < 0.02
    assert engines["mean_abs_dlogprob"] < 0.01 and engines["max_abs_dlogprob"] < 0.05
    assert abs(math.log(engines["perplexity_ratio"])) < 0.001
