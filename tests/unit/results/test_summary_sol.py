"""The speed-of-light column of a sweep's summary: the median share of each arm's decode, the
regime and probe it was taken against, and a share over 100 % with its reason."""

import csv
import io

import pytest

from omni_ray.measure.regime import CACHE_RESIDENT, DRAM_BOUND
from omni_ray.measure.speed_of_light import sol_fields
from omni_ray.results.summary import summarize_arms, to_csv, to_markdown

MiB = 1 << 20
LLC = 32 * MiB
METRICS = ["decode_tok_s", "decode_sol_frac"]
DRAM = {"regime": DRAM_BOUND, "ceiling_gb_s": 40.0, "size_bytes": 1 << 30}
CACHE = {"regime": CACHE_RESIDENT, "ceiling_gb_s": 10.0, "size_bytes": 8 * MiB}


def rec(arm, tok_s, wb, probe):
    m = {"decode_tok_s": tok_s, "decode_weight_bytes_per_token": wb, "llc_bytes": LLC,
         "decode_regime": DRAM_BOUND if wb > LLC else CACHE_RESIDENT}
    return {"arm": {"id": arm}, "status": "ok", "measurements": m | sol_fields(m, probe)}


def summary():
    return summarize_arms([
        rec("int4", 168.0, 205_000_000, DRAM), rec("int4", 170.0, 205_000_000, DRAM),
        rec("int4", 175.0, 205_000_000, DRAM),
        rec("tiny", 3000.0, 4_000_000, CACHE), rec("tiny", 2900.0, 4_000_000, CACHE),
        {"arm": {"id": "old"}, "status": "ok", "measurements": {"decode_tok_s": 5.0}},
    ], METRICS)


def test_each_arm_carries_its_share_regime_and_probe():
    s = summary()
    sol = s["arms"]["int4"]["speed_of_light"]
    assert sol["fraction"] == pytest.approx(170 * 205e6 / 40e9)  # the median pass
    assert sol["n"] == 3 and sol["regime"] == DRAM_BOUND
    assert sol["probes"] == ["DRAM probe (1024 MiB buffer)"] and sol["bandwidth_gb_s"] == 40.0
    assert sol["text"] == "87 % of DRAM probe (1024 MiB buffer), DRAM-bound"
    assert "speed_of_light" not in s["arms"]["old"]
    assert s["arms"]["int4"]["metrics"]["decode_sol_frac"]["median"] == pytest.approx(0.87125)


def test_over_100_percent_carries_its_reason():
    sol = summary()["arms"]["tiny"]["speed_of_light"]
    assert sol["fraction"] == pytest.approx(2950 * 4e6 / 10e9)
    assert sol["text"].startswith("118 % of cache probe (8 MiB buffer), cache-resident "
                                  "(over 100 %: ")
    assert "cache probe is slower" in sol["text"]


def test_the_markdown_has_a_decode_percent_of_sol_column_naming_the_regime():
    md = to_markdown(summary())
    assert md.splitlines()[0] == ("| arm | decode_tok_s | decode regime | decode % of SoL "
                                  "| n | flags |")
    assert "| int4 | 170 (4.1%) | DRAM-bound | 87 % of DRAM probe (1024 MiB buffer), " \
           "DRAM-bound | 3 |" in md
    assert "| tiny | 2950 (3.4%) | cache-resident | 118 % of cache probe" in md
    assert "| old | 5 (0.0%) | - | - | 1 |" in md
    assert "decode % of SoL: " in md


def test_the_csv_row_of_the_share_notes_regime_and_probe():
    rows = {(r["arm"], r["metric"]): r
            for r in csv.DictReader(io.StringIO(to_csv(summary())))}
    row = rows[("int4", "decode_sol_frac")]
    assert float(row["median"]) == pytest.approx(0.87125)
    assert row["note"] == "87 % of DRAM probe (1024 MiB buffer), DRAM-bound"
    assert rows[("int4", "decode_tok_s")]["note"] == ""


def test_without_probes_the_table_is_as_before():
    r = {"arm": {"id": "a"}, "status": "ok", "measurements": {"ready_s": 1.0}}
    md = to_markdown(summarize_arms([r], ["ready_s", "decode_sol_frac"]))
    assert md.splitlines()[0] == "| arm | ready_s | n | flags |"
