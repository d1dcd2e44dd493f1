import dataclasses
import json

import pytest

from omni_ray.errors import UserError
from omni_ray.results.record import (SCHEMA_VERSION, config_hash, is_retracted, make_record,
                                     retract, upgrade)

CONFIG = {"model": "qwen3-1.7b", "stages": [{"node": 0, "kv_cache_mib": 512}], "seed": 0}


def rec(**kw):
    args = dict(kind="engine_point", config=CONFIG, measurements={"ready_s": 12.5},
                status="ok", provenance={"host": "h"})
    args.update(kw)
    return make_record(**args)


def test_config_hash_is_order_independent_and_16_hex():
    h = config_hash(CONFIG)
    assert len(h) == 16 and int(h, 16) >= 0
    reordered = {"seed": 0, "stages": [{"kv_cache_mib": 512, "node": 0}], "model": "qwen3-1.7b"}
    assert config_hash(reordered) == h
    assert config_hash({**CONFIG, "seed": 1}) != h


def test_config_hash_of_a_dataclass_equals_its_dict():
    @dataclasses.dataclass(frozen=True)
    class C:
        model: str
        seed: int

    assert config_hash(C("m", 1)) == config_hash({"seed": 1, "model": "m"})


def test_config_hash_refuses_what_json_cannot_hold():
    with pytest.raises(TypeError, match="not canonical-JSON serialisable"):
        config_hash({"x": {1, 2}})
    with pytest.raises(TypeError, match="must be a dict or dataclass, got list"):
        config_hash([1])


def test_make_record_fields():
    r = rec(extra={"arm": {"id": "a0"}, "pass": 2}, pinning={"violations": []})
    assert r["schema_version"] == SCHEMA_VERSION == 1
    assert r["kind"] == "engine_point" and r["status"] == "ok"
    assert r["config_hash"] == config_hash(CONFIG) and r["config"] == CONFIG
    assert r["measurements"] == {"ready_s": 12.5}
    assert r["error"] is None and r["stderr_tail"] is None
    assert r["arm"] == {"id": "a0"} and r["pass"] == 2
    assert r["provenance"] == {"host": "h"}
    json.dumps(r, allow_nan=False)


def test_make_record_copies_its_inputs():
    config = {"a": [1]}
    r = rec(config=config)
    config["a"].append(2)
    assert r["config"] == {"a": [1]}


def test_failed_record_keeps_error_and_stderr():
    r = rec(status="timeout", measurements={}, error="no ready in 600 s",
            stderr_tail="...\nKilled")
    assert r["status"] == "timeout" and r["stderr_tail"].endswith("Killed")


@pytest.mark.parametrize("kw, message", [
    ({"status": "done"}, "status must be one of ok, failed, timeout, got 'done'"),
    ({"status": "failed"}, "a 'failed' record needs an error message"),
    ({"kind": ""}, "kind must be a non-empty string"),
    ({"extra": {"config": {}}}, "extra key 'config' would shadow a record field"),
    ({"extra": {"retracted": True}}, "extra key 'retracted' would shadow"),
])
def test_make_record_refuses(kw, message):
    with pytest.raises(ValueError, match=message):
        rec(**kw)


def test_provenance_is_collected_when_not_given(monkeypatch):
    from omni_ray.results import provenance

    monkeypatch.setattr(provenance, "collect", lambda: {"collected": True})
    assert rec(provenance=None)["provenance"] == {"collected": True}


def test_version_0_record_upgrades():
    v0 = {"config": {"model": "m"}, "results": {"ready_s": 3.0}, "ok": True, "note": "keep me"}
    r = upgrade(v0)
    assert r["schema_version"] == 1 and r["upgraded_from"] == 0
    assert r["measurements"] == {"ready_s": 3.0} and "results" not in r
    assert r["status"] == "ok" and "ok" not in r
    assert r["config_hash"] == config_hash({"model": "m"})
    assert r["kind"] == "unknown" and r["error"] is None and r["provenance"] is None
    assert r["note"] == "keep me"
    assert "schema_version" not in v0  # input untouched


def test_version_0_failures_and_bare_records():
    assert upgrade({"metrics": {"x": 1}, "error": "boom"})["status"] == "failed"
    assert upgrade({"ok": False})["status"] == "failed"
    bare = upgrade({})
    assert bare["status"] == "ok" and bare["measurements"] == {} and bare["config"] == {}


def test_current_record_upgrades_to_itself():
    r = rec()
    assert upgrade(r) == r


def test_newer_or_bad_versions_are_user_errors():
    with pytest.raises(UserError, match="r.json: schema_version 2 is newer than this omni-ray"):
        upgrade({"schema_version": 2}, source="r.json")
    with pytest.raises(UserError, match="schema_version must be a non-negative integer, got '1'"):
        upgrade({"schema_version": "1"})
    with pytest.raises(UserError, match="not a result record"):
        upgrade([1, 2])


def test_retract_keeps_the_data():
    r = rec()
    x = retract(r, "ran with turbo boost on", "results/2026-01-02.json", on="2026-01-03")
    assert is_retracted(x) and not is_retracted(r)
    assert x["retracted_on"] == "2026-01-03"
    assert x["reason"] == "ran with turbo boost on"
    assert x["superseded_by"] == "results/2026-01-02.json"
    assert x["measurements"] == r["measurements"] and x["config_hash"] == r["config_hash"]
    assert retract(r, "why", None)["retracted_on"].endswith("+00:00")
    assert upgrade(x)["retracted"] is True


def test_retract_refuses_twice_and_needs_a_reason():
    with pytest.raises(ValueError, match="needs a reason"):
        retract(rec(), "  ", None)
    x = retract(rec(), "first", None, on="2026-01-03")
    with pytest.raises(ValueError, match="already retracted \\(on 2026-01-03: first\\)"):
        retract(x, "second", None)
