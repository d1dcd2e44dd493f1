"""Every vLLM / torch internal that a vllm_omni shim relies on still exists in the pinned vLLM."""

from __future__ import annotations

import pytest

from vllm_omni import patches

pytestmark = pytest.mark.compat


@pytest.mark.parametrize("patch", patches.PATCHES, ids=lambda p: p.NAME)
def test_patch_target_exists(patch):
    patch.find_target()  # raises LookupError naming what is gone


def test_register_applies_every_patch_and_is_idempotent():
    import vllm_omni

    vllm_omni.register()
    first = vllm_omni.patch_report()
    vllm_omni.register()
    assert vllm_omni.patch_report() == first
    assert all(s["applied"] for s in first.values()), first


def test_a_missing_target_is_reported_not_raised(monkeypatch):
    from vllm_omni.patches import kv_budget

    def gone():
        raise LookupError("CpuPlatform.check_and_update_config is not a classmethod here")

    monkeypatch.setattr(kv_budget, "find_target", gone)
    status = {s.name: s for s in patches.apply_all()}["kv_budget"]
    assert status.applied is False and "target missing" in status.reason


def test_off_switch(monkeypatch):
    monkeypatch.setenv("VLLM_OMNI_DISABLE_AOT_CACHE", "1")
    status = {s.name: s for s in patches.apply_all()}["aot_cache"]
    assert status.reason == "disabled by VLLM_OMNI_DISABLE_AOT_CACHE=1"
