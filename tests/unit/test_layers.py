"""The import direction of style.md, checked in a fresh interpreter per package: measurement,
topology, results and config import neither Ray nor vLLM nor vllm_omni; the API imports no
display and no Ray (the CLI passes its display in; the Ray lifecycle is omni_ray.placement's)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import omni_ray

ENGINE_AND_RAY = ("ray", "vllm", "vllm_omni", "torch")
LAYERS = {
    "omni_ray.measure": ENGINE_AND_RAY,
    "omni_ray.topology": ENGINE_AND_RAY,
    "omni_ray.results": ENGINE_AND_RAY,
    "omni_ray.config": ENGINE_AND_RAY,
    "omni_ray.monitor": ENGINE_AND_RAY,
    "omni_ray.cli.topology": ENGINE_AND_RAY,
    "omni_ray.api": ("ray", "omni_ray.cli"),
    # engines import their engine inside load(), in the engine process; never Ray
    "omni_ray.engines": ENGINE_AND_RAY,
}

# Imports the package and every module under it, then prints what it pulled in.
PROBE = """
import importlib, json, pkgutil, sys
name, forbidden = sys.argv[1], json.loads(sys.argv[2])
mod = importlib.import_module(name)
for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
    importlib.import_module(info.name)
print(json.dumps(sorted(m for m in sys.modules
                        if any(m == f or m.startswith(f + ".") for f in forbidden))))
"""


def imported(package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, package, json.dumps(forbidden)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("package", LAYERS)
def test_package_imports_nothing_above_its_layer(package):
    assert imported(package, LAYERS[package]) == []


def test_the_probe_sees_a_forbidden_import():
    # the coordinator is the Ray layer and imports Ray at the top: the probe must report it
    assert "ray" in imported("omni_ray.placement.coordinator", ("ray",))


def test_api_imports_neither_ray_nor_a_display_even_inside_a_function():
    # Deferred imports do not show in sys.modules at import time; the source must not have them.
    tree = ast.parse((Path(omni_ray.__file__).parent / "api.py").read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    bad = [m for m in names if m.split(".")[0] == "ray" or m.startswith("omni_ray.cli")]
    assert bad == []
