import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_report_imports_neither_ray_nor_vllm(make_run, tmp_path):
    run_dir = make_run("s", {"x=1": [{"decode_tok_s": 1.0}], "x=2": [{"decode_tok_s": 2.0}]})
    code = (
        "import sys\n"
        "from omni_ray.report import write_report, compare_runs\n"
        f"write_report([{str(run_dir)!r}])\n"
        f"compare_runs({str(run_dir)!r}, {str(run_dir)!r})\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm', 'torch'))\n"
        "print(bad)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert (run_dir / "report.html").is_file()
