"""The API without Ray: a dry run plans, emits its plan to the consumer passed in, writes nothing."""

from __future__ import annotations

import io

import pytest

import omni_ray
from omni_ray import events
from omni_ray.cli.display import Progress
from omni_ray.errors import UserError

SWEEP = {"name": "dry", "model": "tiny", "stage": {"kv_cache_mib": 32},
         "matrix": {"batch": [1, 2, 4]}}


def test_a_dry_run_emits_its_plan_and_starts_nothing(tmp_path):
    seen: list[events.Event] = []
    report = omni_ray.run_sweep(SWEEP, out=tmp_path / "res", dry_run=True, passes=2,
                                on_event=seen.append)
    (plan,) = seen
    assert isinstance(plan, events.Planned) and plan.passes == 2
    ((sweep, arms, out_dir),) = plan.planned
    assert sweep.name == "dry" and list(arms) == report.arms and len(arms) == 3
    assert out_dir == report.out_dirs["dry"] and out_dir.parent == tmp_path / "res" / "dry"
    assert not (tmp_path / "res").exists()


def test_the_terminal_view_prints_the_plan(tmp_path):
    out = io.StringIO()
    omni_ray.run_sweep(SWEEP, out=tmp_path, dry_run=True, on_event=Progress(out))
    text = out.getvalue()
    assert text.startswith(f"sweep dry (<dict>): 3 arms x 3 passes -> {tmp_path / 'dry'}/")
    assert text.count("batch=") == 3 and text.endswith("dry run: nothing was started\n")


def test_passes_below_one_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--passes: must be >= 1, got 0"):
        omni_ray.run_sweep(SWEEP, out=tmp_path, dry_run=True, passes=0)


# --- run_stage and doctor: what `omni-ray stage` and `omni-ray doctor` call ---------------

@pytest.fixture
def fake_stage_engine(tmp_path, monkeypatch):
    """A model config on disk (for the budget check), this machine's first slot, and an engine
    launch that records its request and returns a measured result."""
    import json

    from omni_ray.engine import launch
    from omni_ray.models import build

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 256,
        "num_hidden_layers": 2}))
    monkeypatch.setattr(build, "resolve_model", lambda name: model)
    launched = []

    def launch_arm(req, workdir, name, *, timeout_s):
        launched.append((req, timeout_s))
        return {"status": "ok", "measurements": {"decode_tok_s": 12.5}, "pinning": None,
                "log": {"greedy_argmax": 1}, "log_path": str(workdir / "stage.log")}

    monkeypatch.setattr(launch, "launch_arm", launch_arm)
    return launched


def test_run_stage_launches_one_arm_on_the_first_slot_and_writes_its_record(
        fake_stage_engine, tmp_path):
    out = tmp_path / "stage.json"
    record = omni_ray.run_stage({"model": "tiny", "kv_cache_mib": 16, "max_model_len": 256},
                                {"output_len": 4}, timeout_s=30.0, out=out,
                                workdir=tmp_path / "work")
    ((req, timeout_s),) = fake_stage_engine
    assert timeout_s == 30.0 and req.workload.output_len == 4
    assert req.stage.kv_cache_mib == 16 and list(req.cpus) == record["slot"]["cpus"]
    assert record["kind"] == "stage" and record["status"] == "ok"
    assert record["measurements"]["decode_tok_s"] == 12.5
    assert record["log"] == {"greedy_argmax": 1}
    import json

    assert json.loads(out.read_text())["measurements"] == record["measurements"]


def test_run_stage_refuses_a_budget_too_small_before_starting_an_engine(fake_stage_engine):
    with pytest.raises(UserError, match=r"^kv_cache_mib: 1 MiB holds .* fewer than one "
                                        r"sequence of max_model_len=4096"):
        omni_ray.run_stage({"model": "tiny", "kv_cache_mib": 1, "max_model_len": 4096}, {})
    assert fake_stage_engine == []


def test_the_stage_verb_is_the_api_call(fake_stage_engine, capsys):
    from omni_ray import cli

    rc = cli.main(["stage", "--kv-cache-mib", "16", "--max-model-len", "256",
                   "--output-len", "4", "--timeout", "30"])
    ((req, timeout_s),) = fake_stage_engine
    assert rc == 0 and timeout_s == 30.0 and req.workload.output_len == 4
    assert '"decode_tok_s": 12.5' in capsys.readouterr().out


def test_doctor_is_ok_only_with_every_patch_applied(monkeypatch):
    from omni_ray.engine import installation

    info = {"versions": {}, "vllm_general_plugins": [], "quantization": {"cpu_int4": True},
            "kernels": {}, "upstream_changed": [],
            "patches": {"aot_cache": {"applied": True, "reason": "applied", "target": "t"}}}
    monkeypatch.setattr(installation, "collect", lambda: info)
    assert omni_ray.doctor()["ok"] is True
    info["patches"]["aot_cache"] = {"applied": False, "reason": "target missing: x",
                                    "target": "t"}
    assert omni_ray.doctor()["ok"] is False


def test_the_stage_verb_refuses_a_field_the_engine_has_no_meaning_for(fake_stage_engine, capsys):
    from omni_ray import cli

    rc = cli.main(["stage", "--engine", "llamacpp", "--kv-cache-mib", "16", "--no-detokenize"])
    assert rc == 2 and fake_stage_engine == []
    assert capsys.readouterr().err.strip() == (
        "omni-ray stage: error: omni-ray stage: kv_cache_mib: has no meaning for engine "
        "llamacpp (it sizes its own KV cache); leave it out, got 16")
