import functools

import pytest

from tests.unit.report.fakes import make_run_dir


@pytest.fixture
def make_run(tmp_path):
    """make_run(name, {label: [measurements of pass 1, pass 2, ...]}) -> the run directory."""
    return functools.partial(make_run_dir, tmp_path)
