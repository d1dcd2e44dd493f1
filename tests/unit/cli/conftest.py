import pytest

from omni_ray import cli


@pytest.fixture(autouse=True)
def model_cache(tmp_path, monkeypatch):
    """Builds triggered by a shape name land in a fresh cache, never the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OMNI_RAY_CACHE", str(cache))
    return cache


@pytest.fixture
def user_error(capsys):
    """Run ``omni-ray ARGV`` in-process; assert exit 2 and one error line; return that line."""

    def run(*argv):
        argv = [str(a) for a in argv]
        rc = cli.main(argv)
        out, err = capsys.readouterr()
        assert rc == 2, (rc, out, err)
        assert "Traceback" not in err
        lines = err.splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith(f"omni-ray {argv[0]}: error: "), lines[0]
        return lines[0]

    return run
