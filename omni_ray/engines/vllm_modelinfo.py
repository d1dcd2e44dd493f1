"""vLLM's facts about a model class (``VLLM_CACHE_ROOT/modelinfos``), learnt once per machine and
outside every measured window.

Each arm's engine gets a ``VLLM_CACHE_ROOT`` of its own, so that a compiled arm's start is cold or
warm as its config says. vLLM also keeps there what it learnt of a model class (keyed on the
class's source), and without it learns it again at every start in a subprocess that imports vLLM
and the plugins: ~6 s of ``init_s`` and ~410 MiB of RssAnon beside the engine while it runs, which
was all of the `small` cpu_int4 arm's peak during load over its settled RssAnon (841 vs 714 MiB,
``results/engine_start/``). So the arm's ``modelinfos`` is a link to one shared copy under
omni-ray's cache (:func:`share`), and before the tree sampler starts the runner has the model's
classes learnt into it if they are not there yet (:func:`warm`, in a process of its own): the first
arm on a machine measures what every later one does.

    python -m omni_ray.engines.vllm_modelinfo MODEL_DIR   (what warm() runs; needs VLLM_CACHE_ROOT)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from omni_ray import envs

MODELINFOS = "modelinfos"


def shared_dir() -> Path:
    return envs.cache_dir() / "vllm-modelinfos"


def share(cache_root: str | Path) -> None:
    """Make ``cache_root/modelinfos`` a link to the shared copy (an existing one is left alone).
    Never raises: without the link an engine only starts slower."""
    link = Path(cache_root) / MODELINFOS
    try:
        shared_dir().mkdir(parents=True, exist_ok=True)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists() and not link.is_symlink():
            link.symlink_to(shared_dir(), target_is_directory=True)
    except OSError:
        pass


def architectures(model_path: str | Path) -> list[str]:
    """The model classes its config.json names; [] when it names none or cannot be read."""
    try:
        arches = json.loads((Path(model_path) / "config.json").read_text()).get("architectures")
    except (OSError, ValueError):
        return []
    return [a for a in arches or () if isinstance(a, str)]


def missing(model_path: str | Path) -> list[str]:
    """The model's classes that have no entry in the shared copy (vLLM names an entry
    ``<module with - for .>-<class>.json``; whether it is stale, vLLM decides by its hash) and
    were never found to have none (``<class>.uncached``: a class a plugin registered already
    imported, which vLLM inspects in its own process and does not cache)."""
    have = {p.name for p in shared_dir().iterdir()} if shared_dir().is_dir() else set()
    return [a for a in architectures(model_path)
            if f"{a}.uncached" not in have and not any(n.endswith(f"-{a}.json") for n in have)]


def warm(cache_root: str | None, model_path: str, timeout_s: float = 300) -> str:
    """Link the arm's cache to the shared copy and learn the model's missing classes into it;
    returns what it did ("off", "cached", "learnt", or why not), never raises."""
    if not cache_root:
        return "off"  # vLLM's own default cache, kept by the user
    share(cache_root)
    todo = missing(model_path)
    if not todo:
        return "cached"
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(model_path)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s, env=os.environ | {"VLLM_CACHE_ROOT": cache_root})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not learnt: {type(exc).__name__}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1]
        return f"not learnt: exit {done.returncode}: {last}"
    left = missing(model_path)
    for arch in left:  # not asked again at every start
        try:
            (shared_dir() / f"{arch}.uncached").touch()
        except OSError:
            pass
    return "learnt" if not left else f"not cached by vLLM: {', '.join(left)}"


def main(argv: list[str]) -> int:
    import vllm_omni

    vllm_omni.register()
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in architectures(argv[0]):
        if arch in ModelRegistry.models:  # on a miss vLLM inspects it and saves the entry
            ModelRegistry.models[arch].inspect_model_cls()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
