import pytest


@pytest.fixture(autouse=True)
def model_cache(tmp_path, monkeypatch):
    """Every build a test triggers by shape name lands in a fresh cache, never the user's."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("OMNI_RAY_CACHE", str(cache))
    return cache
