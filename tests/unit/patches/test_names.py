"""omni_ray's config spells vllm_omni's patch names and off switches out (it must validate a
sweep file without importing vllm_omni); vllm_omni checks here that the copies agree with it."""

from omni_ray.config import fields
from vllm_omni import envs, patches


def test_config_lists_the_patches_vllm_omni_applies_in_its_order():
    assert fields.PATCHES == tuple(p.NAME for p in patches.PATCHES)


def test_config_knows_vllm_omnis_off_switches():
    assert fields.PATCHES_OFF == envs.VLLM_OMNI_DISABLE
    assert fields.PATCH_OFF_PREFIX == envs.DISABLE_PREFIX
    assert [fields.PATCH_OFF_PREFIX + n.upper() for n in fields.PATCHES] == \
        [envs.patch_off_switch(p.NAME) for p in patches.PATCHES]
