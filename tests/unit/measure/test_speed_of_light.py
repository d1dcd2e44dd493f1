"""The speed-of-light arithmetic (measure/speed_of_light.py): bytes a token reads, the bound of
each regime, the record fields and the text of a share over 100 %."""

import pytest

from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND, checkpoint_bytes_per_token
from omni_ray.measure.speed_of_light import (INT4_GROUP_SIZE, INT4_N_MULTIPLE, bytes_per_token,
                                             percent_text, probe_regime, probe_sizes,
                                             regime_bound, sol_fields)
from omni_ray.models.build import build_model
from omni_ray.models.shapes import SHAPES

MiB = 1 << 20
LLC = 32 * MiB
PROBES = {DRAM_BOUND: {"ceiling_gb_s": 40.0, "size_bytes": 1024 * MiB},
          CACHE_RESIDENT: {"ceiling_gb_s": 200.0, "size_bytes": 8 * MiB}}


def test_probe_buffers_are_sized_for_their_regime():
    sizes = probe_sizes(LLC)
    assert sizes[DRAM_BOUND] >= 8 * LLC and sizes[CACHE_RESIDENT] * 2 <= LLC
    assert probe_sizes(None) == {DRAM_BOUND: 1 << 30}
    assert probe_sizes(512 * MiB)[DRAM_BOUND] == 4096 * MiB  # 8x a large LLC, over 1 GiB


def test_the_probe_is_the_regime_s_and_dram_without_an_llc():
    assert probe_regime(4 * MiB, LLC) == CACHE_RESIDENT
    assert probe_regime(205_000_000, LLC) == DRAM_BOUND
    assert probe_regime(4 * MiB, None) == DRAM_BOUND


def test_a_cache_resident_figure_uses_the_cache_probe():
    row = regime_bound(2000.0, 4_000_000, LLC, PROBES)  # 8 GB/s achieved
    assert row["regime"] == CACHE_RESIDENT
    assert row["bandwidth_gb_s"] == 200.0
    assert row["bandwidth_probe"] == "cache probe (8 MiB buffer)"
    assert row["fraction"] == pytest.approx(0.04) and row["fraction_text"] == "4 %"


def test_a_dram_bound_figure_uses_the_dram_probe():
    row = regime_bound(40.0, 773_000_000, LLC, PROBES)  # 30.9 GB/s achieved
    assert row["regime"] == DRAM_BOUND and row["bandwidth_probe"] == "DRAM probe (1024 MiB buffer)"
    assert row["fraction"] == pytest.approx(40 * 773e6 / 40e9)


def test_without_the_regime_s_probe_there_is_no_bound():
    row = regime_bound(2000.0, 4_000_000, LLC, {DRAM_BOUND: PROBES[DRAM_BOUND]})
    assert row["regime"] == CACHE_RESIDENT and row["fraction"] is None
    assert row["fraction_text"] == "-"


def test_over_100_percent_always_says_why():
    assert percent_text(0.5) == "50 %"
    assert percent_text(None) == "-"
    assert percent_text(0.87, against="DRAM probe (1024 MiB buffer)") == \
        "87 % of DRAM probe (1024 MiB buffer)"
    over = [percent_text(1.2, DRAM_BOUND, 40 * MiB, LLC),
            percent_text(1.2, DRAM_BOUND, 800 * MiB, LLC),
            percent_text(1.2, CACHE_RESIDENT, MiB, LLC), percent_text(1.2)]
    assert all(t.startswith("120 % (over 100 %: ") for t in over), over
    assert "1.2x the LLC" in over[0]


def measured(tok_s, wb, llc=LLC):
    return {"decode_tok_s": tok_s, "decode_weight_bytes_per_token": wb, "llc_bytes": llc}


def probe(label, gb_s, size):
    return {"regime": label, "ceiling_gb_s": gb_s, "size_bytes": size, "kernel": "sum_bf16",
            "cpus": [0, 1], "cached": False, "sum_bf16_times_s": [0.1, 0.1]}


def test_record_fields_of_a_dram_bound_decode():
    # cpu_int4 qwen2.5-0.5b: 205 MB a token at 40 GB/s: 195 tok/s bound, 170 achieved
    got = sol_fields(measured(170.0, 205_000_000), probe(DRAM_BOUND, 40.0, 1 << 30))
    assert got["weight_bytes_per_token"] == 205_000_000
    assert got["sol_bandwidth_gb_s"] == 40.0
    assert got["decode_sol_tok_s"] == pytest.approx(40e9 / 205e6)
    assert got["decode_sol_frac"] == pytest.approx(170 * 205e6 / 40e9)
    assert got["sol_probe"]["regime"] == DRAM_BOUND
    assert got["sol_probe"]["size_bytes"] == 1 << 30
    assert got["sol_probe"]["name"] == "DRAM probe (1024 MiB buffer)"
    assert "sum_bf16_times_s" not in got["sol_probe"]  # the samples stay in the probe's file
    assert got["decode_sol_text"] == "87 % of DRAM probe (1024 MiB buffer)"


def test_record_fields_of_a_cache_resident_decode_over_100_percent_say_why():
    got = sol_fields(measured(3000.0, 4_000_000), probe(CACHE_RESIDENT, 10.0, 8 * MiB))
    assert got["decode_sol_frac"] == pytest.approx(1.2)
    assert got["decode_sol_text"].startswith("120 % of cache probe (8 MiB buffer) (over 100 %: ")
    assert "cache probe is slower" in got["decode_sol_text"]


def test_batch_rows_share_one_read_of_the_weights():
    got = sol_fields(measured(340.0, 205_000_000), probe(DRAM_BOUND, 40.0, 1 << 30), batch=2)
    assert got["decode_sol_tok_s"] == pytest.approx(2 * 40e9 / 205e6)
    assert got["decode_sol_frac"] == pytest.approx(170 * 205e6 / 40e9)


def test_a_probe_of_the_other_regime_gives_no_fraction():
    got = sol_fields(measured(3000.0, 4_000_000), probe(DRAM_BOUND, 40.0, 1 << 30))
    assert got["decode_sol_frac"] is None and got["decode_sol_tok_s"] is None
    assert got["decode_sol_text"].startswith("- (the probe is the DRAM-bound one")


@pytest.mark.parametrize("m,p", [
    (measured(None, 4_000_000), probe(DRAM_BOUND, 40.0, 1 << 30)),
    (measured(100.0, None), probe(DRAM_BOUND, 40.0, 1 << 30)),
    (measured(100.0, 4_000_000), None),
    (measured(100.0, 4_000_000), {"regime": DRAM_BOUND, "error": "the probe exited with 1"})])
def test_no_figure_bytes_or_bandwidth_gives_no_fields(m, p):
    assert sol_fields(m, p) == {}


def test_int4_defaults_are_vllm_omni_s():
    from vllm_omni.quantization import grid

    assert INT4_GROUP_SIZE == grid.DEFAULT_GROUP_SIZE
    cpu_int4 = pytest.importorskip("vllm_omni.quantization.cpu_int4")
    assert INT4_N_MULTIPLE == cpu_int4.N_MULTIPLE


def test_cpu_int4_quantized_at_load_reads_int4_bytes(tmp_path):
    model = build_model("tiny", tmp_path / "tiny")
    bf16 = checkpoint_bytes_per_token(model)
    int4 = checkpoint_bytes_per_token(model, "cpu_int4")
    assert bf16 == bytes_per_token(SHAPES["tiny"], "bf16")["total"]
    assert int4 == bytes_per_token(SHAPES["tiny"], "int4")["total"]
    assert int4 < bf16 / 3
    assert checkpoint_bytes_per_token(model, dtype="float32") == 2 * bf16
