"""The float32 decode loop built for another CPU: aarch64 (NEON) with Debian's cross compiler, run
under qemu-user, against torch on the same inputs. Its speed there is not measured (an emulator's
timings mean nothing); that it computes the product, at every row count the chunks split into, is.
CI installs gcc-aarch64-linux-gnu and qemu-user; without them this test skips and says so."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import inferlab.quant

SOURCE = Path(inferlab.quant.__file__).with_name("f32.c")
HARNESS = Path(__file__).with_name("f32_harness.c")
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


@pytest.fixture(scope="module")
def aarch64_binary(tmp_path_factory):
    if not (shutil.which(CC) and shutil.which(QEMU)):
        pytest.skip(f"needs {CC} and {QEMU} (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)")
    out = tmp_path_factory.mktemp("aarch64") / "f32_harness"
    subprocess.run([CC, "-O3", "-static", str(SOURCE), str(HARNESS), "-o", str(out)], check=True,
                   capture_output=True, text=True)
    return out


def run(binary: Path, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    payload = np.array([x.shape[0], x.shape[1], w.shape[0]], np.int32).tobytes() + x.numpy().tobytes() + w.numpy().tobytes()
    done = subprocess.run([QEMU, str(binary)], input=payload, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-500:]
    return torch.from_numpy(np.frombuffer(done.stdout, np.float32).copy()).view(x.shape[0], w.shape[0])


def test_the_binary_is_an_aarch64_one(aarch64_binary):
    head = aarch64_binary.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 9])
def test_the_aarch64_build_matches_torch(aarch64_binary, rows):
    torch.manual_seed(rows)
    x, w = torch.randn(rows, 96), torch.randn(20, 96)
    torch.testing.assert_close(run(aarch64_binary, x, w), x @ w.T, rtol=1e-5, atol=1e-4)
