from omni_ray.bench.share_engine import engine_starts, grid, with_sharing
from omni_ray.config import expand
from omni_ray.config.loader import sweep_from_dict


def test_engine_starts_counts_the_arms_that_started_their_own():
    records = [{"shared_engine": None}, {"shared_engine": {"position": 0}},
               {"shared_engine": {"position": 1}}, {"shared_engine": {"position": 2}}, {}]
    assert engine_starts(records) == 3


def test_the_grid_is_sixteen_arms_of_one_stage_config_with_sharing_set_either_way():
    for on in (True, False):
        sweep = sweep_from_dict(with_sharing(grid(), on))
        arms = expand(sweep)
        assert sweep.placement.share_engine is on and sweep.name == f"grid_{'on' if on else 'off'}"
        assert len(arms) == 16 and len({repr(a.stage) for a in arms}) == 1
