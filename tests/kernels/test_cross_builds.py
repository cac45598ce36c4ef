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


# The quantized decode loops' NEON build (inferlab/quant/neon.c), with and without the dot-product
# extension, against the x86 loops on the same codes: the portable build of vnni.c, whose arithmetic
# tests/kernels/test_quant_vnni.py checks against torch. Both quantize the activations the same way
# (loops.h), so they differ by float summation order only.
QUANT_SOURCE = Path(inferlab.quant.__file__).with_name("neon.c")
QUANT_HARNESS = Path(__file__).with_name("quant_harness.c")
KINDS = {"int8": 0, "int4": 1, "q8_0": 2, "q4_0": 3, "q4_1": 4, "q4_k": 5, "nf4": 6}


@pytest.fixture(scope="module", params=["", "-march=armv8.2-a+dotprod"], ids=["neon", "neon-dotprod"])
def neon_binary(request, tmp_path_factory):
    if not (shutil.which(CC) and shutil.which(QEMU)):
        pytest.skip(f"needs {CC} and {QEMU} (Debian: apt-get install gcc-aarch64-linux-gnu qemu-user)")
    out = tmp_path_factory.mktemp("aarch64") / "quant_harness"
    flags = [request.param] if request.param else []
    subprocess.run([CC, "-O3", "-static", *flags, f"-I{QUANT_SOURCE.parent}", str(QUANT_SOURCE), str(QUANT_HARNESS),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    return out


def _module(kind: str, k: int):
    from torch import nn

    from inferlab.quant import GGMLLinear, Int4Linear, Int8Linear, NF4Linear
    from inferlab.quant.nf4 import NF4_TABLE
    lin = nn.Linear(k, 24, bias=False)
    if kind == "int8":
        mod = Int8Linear.from_float(lin)
        return mod, [mod.qweight, mod.scales], 0
    if kind == "int4":
        mod = Int4Linear.from_float(lin, 64)
        return mod, [mod.qweight, mod.scales, mod.zeros], 64
    if kind == "nf4":
        mod = NF4Linear.from_float(lin, 64)
        return mod, [mod.qweight, mod.absmax, NF4_TABLE], 64
    mod = GGMLLinear.from_float(lin, kind)
    return mod, [mod.qweight], 0


@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_neon_quantized_loops_match_the_x86_ones(neon_binary, kind, rows, monkeypatch):
    from inferlab.quant import vnni

    torch.manual_seed(rows + KINDS[kind])
    k = 512 if kind == "q4_k" else 192
    mod, buffers, group = _module(kind, k)
    x = torch.randn(rows, k) * torch.linspace(0.1, 3, k)
    payload = np.array([KINDS[kind], rows, k, 24, group], np.int32).tobytes() + x.numpy().tobytes()
    for b in buffers:
        raw = b.contiguous().view(torch.uint8).numpy().tobytes()
        payload += np.array([len(raw)], np.int32).tobytes() + raw
    done = subprocess.run([QEMU, str(neon_binary)], input=payload, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-500:]
    out = torch.from_numpy(np.frombuffer(done.stdout, np.float32).copy()).view(rows, 24)
    monkeypatch.setenv("INFERLAB_VNNI_BUILD", "portable")
    if not vnni.available():
        pytest.skip("the portable build of the x86 loops does not build here")
    with torch.inference_mode():
        x86 = mod(x)
    torch.testing.assert_close(out, x86, rtol=1e-5, atol=1e-4)
    assert (x86 - mod.forward_reference(x)).abs().max() > 0  # both ran the integer loops, not the reference
