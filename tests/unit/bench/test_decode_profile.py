from omni_ray.bench.decode_profile import in_process


def test_profile_is_eager_unless_asked_compiled():
    stage = {"model": "tiny", "enforce_eager": False, "cpp_wrapper": True}
    eager = in_process({"stage": stage, "profile": {"prompt_len": 8}})
    assert eager["stage"]["enforce_eager"] is True
    assert eager["stage"]["multiprocessing"] is False and eager["stage"]["cpp_wrapper"] is True
    compiled = in_process({"stage": stage, "profile": {"prompt_len": 8, "compiled": True}})
    assert compiled["stage"]["enforce_eager"] is False
    assert compiled["stage"]["multiprocessing"] is False
    assert stage == {"model": "tiny", "enforce_eager": False, "cpp_wrapper": True}  # not mutated
