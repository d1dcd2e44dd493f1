import time

import pytest

from omni_ray.measure.clock import Stopwatch, timed


def test_timed_measures_the_block():
    with timed() as t:
        time.sleep(0.02)
    assert 0.015 < t.elapsed < 1.0
    frozen = t.elapsed
    time.sleep(0.01)
    assert t.elapsed == frozen  # stopped: the reading does not move


def test_stopwatch_running_and_stop():
    sw = Stopwatch()
    assert sw.elapsed == 0.0 and not sw.running
    sw.start()
    time.sleep(0.02)
    assert sw.running and sw.elapsed >= 0.015
    stopped = sw.stop()
    assert not sw.running
    assert 0.015 <= stopped < 1.0 and sw.elapsed == stopped  # stop() returns the frozen reading


def test_stop_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        Stopwatch().stop()


def test_timed_stops_on_exception():
    with pytest.raises(ZeroDivisionError):
        with timed() as t:
            1 / 0
    assert not t.running
