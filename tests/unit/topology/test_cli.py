import json
import os

import pytest

from omni_ray import cli

from .conftest import SYSFS_FIXTURES


@pytest.fixture(autouse=True)
def only_topology_verb(monkeypatch):
    """Build the parser with this verb alone, so other verbs' modules are not needed here."""
    monkeypatch.setattr(cli, "VERBS", {"topology": cli.VERBS["topology"]})


def run_json(capsys, *argv):
    assert cli.main(["topology", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_xeon_24_core_slots(capsys):
    root = str(SYSFS_FIXTURES / "xeon8480c_2s")
    data = run_json(capsys, "--sysfs-root", root, "--slot-cores", "24")
    assert data["source"] == "sysfs"
    nodes = [(n["id"], n["cores"], len(n["cpus"])) for n in data["nodes"]]
    assert nodes == [(0, 56, 112), (1, 56, 112)]
    assert data["nodes"][0]["cpus"][:2] == [0, 1] and data["nodes"][0]["mem_total_mb"] > 1_000_000
    slots = [(s["node"], len(s["cpus"])) for s in data["slots"]]
    assert slots == [(0, 48), (0, 48), (1, 48), (1, 48)]
    assert [(u["node"], u["cores"]) for u in data["unused"]] == [(0, 8), (1, 8)]


def test_json_this_machine_live(capsys):
    data = run_json(capsys, "--slot-cores", "1")
    # sysfs when this machine has the NUMA tree, else the psutil fallback
    assert data["source"] == ("sysfs" if os.path.isdir("/sys/devices/system/node") else "psutil")
    assert len(data["slots"]) == sum(node["cores"] for node in data["nodes"])
    # the live machine honours this process's allowed CPUs
    assert {c for s in data["slots"] for c in s["cpus"]} <= os.sched_getaffinity(0)


def test_text(capsys):
    argv = ["topology", "--sysfs-root", str(SYSFS_FIXTURES / "four_node"), "--slot-cores", "3"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "source: sysfs" in out
    assert "node 3: 8 cores, 16 CPUs (24-31,56-63), 63476 MiB" in out
    assert "  n0s1: node 0, 3 cores, CPUs 3-5,35-37" in out
    assert "unused: node 0: 2 cores (CPUs 6-7,38-39)" in out


def test_missing_sysfs_root_is_one_line_exit_2(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    assert cli.main(["topology", "--sysfs-root", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"omni-ray topology: error: sysfs_root: {missing} is not a directory\n"


def test_sysfs_root_without_the_tree_names_it(capsys, tmp_path):
    assert cli.main(["topology", "--sysfs-root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "devices/system/node" in err and err.count("\n") == 1


def test_bad_slot_cores_exit_2(capsys):
    argv = ["topology", "--sysfs-root", str(SYSFS_FIXTURES / "xeon8480c_2s"), "--slot-cores", "0"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "slot_cores: must be between 1 and 56 (cores of node 0), got 0" in err
