"""``compare:`` on a real local Ray: vLLM and llama.cpp loaded on one slot, taking turns, the
order alternating; one pair record with every turn of both sides, a sign test in the summary.

llama.cpp is the paired arm because it costs no engine start (llama-bench loads per run), so
the test pays for one vLLM start beyond the sweep's own pass."""

from __future__ import annotations

import pytest

import omni_ray
from tests.integration.test_engines import llamacpp_buildable, local_ray  # noqa: F401

pytestmark = pytest.mark.integration

PAIRS = 3


@pytest.mark.timeout(1200)
def test_two_engines_take_turns_on_one_slot(llamacpp_buildable, local_ray, tmp_path):  # noqa: F811
    base = "engine=vllm,quantization=null,kv_cache_mib=32,engine_args={}"
    cfg = {"name": "pairs", "model": "tiny", "passes": 1, "timeout_s": 400,
           "placement": {"slot_cores": 1}, "stage": {"max_model_len": 256},
           "workload": {"prompt_len": 16, "output_len": 8, "warmup": 1, "repeats": 2,
                        "detokenize": False},
           "zip": [{"engine": ["vllm", "llamacpp"], "quantization": [None, "Q4_0"],
                    "kv_cache_mib": [32, None],
                    "engine_args": [{}, {"flash_attn": "off", "threads": 1}]}],
           "baseline": base, "compare": {"pairs": PAIRS}}
    report = omni_ray.run_sweep(cfg, out=tmp_path, allow_busy=True)
    assert [r["status"] for r in report.records] == ["ok", "ok"]
    (rec,) = report.pairs
    assert rec["kind"] == "pair" and rec["status"] == "ok", (rec["error"], rec["stderr_tail"])
    assert rec["config"]["baseline"]["label"] == base
    m = rec["measurements"]
    # the order alternates: arm then baseline, then baseline then arm, ...
    assert m["order"] == [[0, 0], [0, 1], [1, 1], [1, 0], [2, 0], [2, 1]]
    arm, baseline = m["turns"]["arm"], m["turns"]["baseline"]
    assert len(arm) == len(baseline) == PAIRS
    assert all(t["decode_tok_s"] > 0 for t in arm + baseline)
    # turns really alternate in time: each ran while the other side waited
    runs = sorted([(t["measured_from"], t["measured_to"], "arm") for t in arm]
                  + [(t["measured_from"], t["measured_to"], "base") for t in baseline])
    assert [side for *_, side in runs] == ["arm", "base", "base", "arm", "arm", "base"]
    assert all(a[1] <= b[0] for a, b in zip(runs, runs[1:]))
    # both engines were loaded at once: each side took every turn in its one process
    assert len({t["pid"] for t in baseline}) == len({t["pid"] for t in arm}) == 1
    assert baseline[0]["pid"] != arm[0]["pid"]
    # both sides on the slot's CPU, read back
    slot_cpus = rec["slot"]["slot"]["cpus"]
    for side in ("a", "b"):
        pin = rec["pinning"][side]
        assert pin["violations"] == [] and pin["allowed_cpus"] == slot_cpus
    assert m["pairs"] == PAIRS and m["pairs_used"] + m["pairs_contended"] <= PAIRS
    summary = report.summaries["pairs"]
    (row,) = summary["pairs"]
    assert row["arm"] != base and row["baseline"] == base and "sign test p=" in row["verdict"] \
        or row["verdict"] == "no usable pair"
    md = (tmp_path / "pairs" / report.run_id / "summary.md").read_text()
    assert "## Paired comparisons" in md
