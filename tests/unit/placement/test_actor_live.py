"""The stage actor's live gauges, set from its engine's progress lines (its real methods, on
recording gauges; no Ray worker runs here)."""

import types

from omni_ray.engine.launch import EngineLog
from omni_ray.engines import PHASE_MARK, PROGRESS_MARK
from omni_ray.placement.actor import StageActor

Actor = StageActor.__ray_actor_class__


class RecordingGauge:
    def __init__(self) -> None:
        self.values = []

    def set(self, value, tags):
        self.values.append((value, tags["slot"]))


def _actor(log: EngineLog | None):
    names = ("decode_tok_s", "prefill_tok_s", "kv_tokens_used", "kv_tokens_budget")
    actor = types.SimpleNamespace(_log=log, _live={n: RecordingGauge() for n in names},
                                  _said=set(), tags={"slot": "n0s0"}, _rss_now=512.0)
    actor._tail = lambda: Actor._tail(actor)
    return actor


def test_progress_lines_set_the_gauges_of_the_running_arms_slot(tmp_path):
    path = tmp_path / "arm.log"
    path.write_text(f"{PHASE_MARK}loading\n{PROGRESS_MARK}{{\"kv_tokens_budget\": 4096}}\n"
                    f"{PHASE_MARK}measuring\n"
                    f"{PROGRESS_MARK}{{\"decode_tok_s\": 41.0, \"prefill_tok_s\": 300.0}}\n"
                    f"{PROGRESS_MARK}{{\"kv_tokens_used\": 160, \"kv_tokens_budget\": 4096}}\n")
    actor = _actor(EngineLog(path))
    assert Actor.status(actor) == {"phase": "measuring", "rss_mb": 512.0}
    assert actor._live["decode_tok_s"].values == [(41.0, "n0s0")]
    assert actor._live["kv_tokens_used"].values == [(160.0, "n0s0")]
    assert actor._live["kv_tokens_budget"].values == [(4096.0, "n0s0")]
    with open(path, "a") as f:
        f.write(f"{PROGRESS_MARK}{{\"decode_tok_s\": 39.5}}\n")
    Actor._tail(actor)
    assert actor._live["decode_tok_s"].values[-1] == (39.5, "n0s0")
    assert actor._live["prefill_tok_s"].values == [(300.0, "n0s0")]  # not said again
    assert actor._said == {"decode_tok_s", "prefill_tok_s", "kv_tokens_used",
                           "kv_tokens_budget"}


def test_before_an_arm_runs_the_actor_is_starting():
    assert Actor.status(_actor(None))["phase"] == "starting"
