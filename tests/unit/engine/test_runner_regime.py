"""The regime the runner puts beside a decode figure (no engine: the model dir and sysfs only)."""

from pathlib import Path

from omni_ray.engine import runner
from omni_ray.models.build import build_model
from omni_ray.models.shapes import SHAPES
from omni_ray.topology import caches

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def test_tiny_on_the_epyc_l3_is_cache_resident(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "SYSFS_ROOT", FIXTURES / "caches_epyc_zen5_2c")
    model = build_model("tiny", tmp_path / "tiny")
    got = runner.decode_regime(str(model), [0, 1])
    assert got["decode_regime"] == "cache-resident"
    assert got["decode_weight_bytes_per_token"] == SHAPES["tiny"].num_parameters() * 2  # tied
    assert got["llc_bytes"] == 32 << 20


def test_no_llc_gives_no_regime_but_keeps_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(caches, "SYSFS_ROOT", tmp_path / "nothing")
    model = build_model("tiny", tmp_path / "tiny")
    got = runner.decode_regime(str(model), None)
    assert got["decode_regime"] is None and got["llc_bytes"] is None
    assert got["decode_weight_bytes_per_token"] > 0
