import pytest

from omni_ray.bench import int4_peers
from omni_ray.bench.speed_of_light import percent_text, probe_sizes, regime_bound
from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND

MiB = 1 << 20
LLC = 32 * MiB
PROBES = {DRAM_BOUND: {"ceiling_gb_s": 40.0, "size_bytes": 1024 * MiB},
          CACHE_RESIDENT: {"ceiling_gb_s": 200.0, "size_bytes": 8 * MiB}}


def test_probe_buffers_are_sized_for_their_regime():
    sizes = probe_sizes(LLC)
    assert sizes[DRAM_BOUND] >= 4 * LLC and sizes[CACHE_RESIDENT] * 2 <= LLC
    assert probe_sizes(None) == {DRAM_BOUND: 1 << 30}


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
    over = [percent_text(1.2, DRAM_BOUND, 40 * MiB, LLC),
            percent_text(1.2, DRAM_BOUND, 800 * MiB, LLC),
            percent_text(1.2, CACHE_RESIDENT, MiB, LLC), percent_text(1.2)]
    assert all(t.startswith("120 % (over 100 %: ") for t in over), over
    assert "1.2x the LLC" in over[0]


def test_int4_peers_rows_name_their_regime_and_probe():
    art = {"gguf": {"bf16": {"bytes": 773_000_000}, "Q4_0": {"bytes": 250_000_000}}}
    rows = {"vllm-int4-eager": {"decode_tok_s": 25.0}, "llamacpp-Q4_0": {"decode_tok_s": 30.0}}
    bw = {"ceiling_gb_s": 40.0, "regimes": PROBES, "llc": {"bytes_for_cpus": LLC}}
    sol = int4_peers.speed_of_light(rows, "qwen2.5-0.5b", art, bw)
    assert {r["regime"] for r in sol["engines"].values()} == {DRAM_BOUND}
    assert sol["engines"]["llamacpp-Q4_0"]["bandwidth_gb_s"] == 40.0
    cell = int4_peers._sol_cell(sol["engines"]["llamacpp-Q4_0"])
    assert cell == "19 % of DRAM probe (1024 MiB buffer), DRAM-bound"
    sol = int4_peers.speed_of_light(rows, "tiny", {"gguf": {"bf16": {"bytes": 3_400_000},
                                                            "Q4_0": {"bytes": 1_000_000}}}, bw)
    assert sol["engines"]["llamacpp-Q4_0"]["regime"] == CACHE_RESIDENT
