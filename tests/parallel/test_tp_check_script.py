"""scripts/tp_check.py, the tensor-parallel step of scripts/gpu_check.sh, on CPU (gloo): a GPU is
lent rarely, so the script must be known to work before it gets there."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_the_tp_step_only_where_cuda_exists():
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert "step tensor_parallel" in text and "scripts/tp_check.py --device cuda" in text
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0


def test_tp1_through_the_launch_path_matches_the_plain_engine():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "tp_check.py"), "--device", "cpu", "--new-tokens", "8"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gloo group of 1" in out.stdout and "for 3 of 3 prompts" in out.stdout, out.stdout
