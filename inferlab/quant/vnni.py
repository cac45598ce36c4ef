"""Decode products for every quantized format on x86 CPUs: AVX-512 VNNI loops (``vnni.c``) and
their AVX2 twins (``avx2.c``), both beside this file.

Why by hand: inductor's loops (``inferlab.quant.fused``) turn each code into a float before the
multiply-add, three or more instructions per weight, which one core runs slower than memory can
feed it; ``torch._int_mm`` adds several eager ops per call. VNNI's ``vpdpbusd`` does 64 byte
products per instruction, AVX2's ``vpmaddubsw`` + ``vpmaddwd`` 32 in two, so these loops read the
packed codes at close to memory speed, the way llama.cpp's Q8_0 and Q4_0 dot products do. The
activations are quantized first: to int8 per group of 128 for INT4 and per block of 32 for the
llama.cpp blocks (llama.cpp's own scheme), so the result differs from dequantize-then-matmul by
that rounding, at most ``sum_k |w_k| * xs / 2`` per output; INT8 keeps 16-bit activation codes
(``vpdpwssd``), which leave its products within about 1e-5 of the float ones. NF4's 16 code
values are floats, not a grid: its loops hold them as int8, round(127 * code), look them up with
``vpshufb`` and multiply int8 activations per block of the weight, as INT4's loops do.

The C files are compiled on first use with the system compiler into ``~/.cache/inferlab``
(``INFERLAB_CACHE``), keyed by their hash, and loaded with ctypes. The build follows the CPU:
AVX-512 VNNI where it has it, else AVX2 (with FMA and F16C), and on aarch64 NEON (``neon.c``, with
the dot-product extension where the CPU has it); ``ATEN_CPU_CAPABILITY=avx2`` or
``default`` (torch's kernels below AVX-512) takes the AVX2 build too, so the process runs as on an
AVX2 laptop. Where there is no compiler, no such x86 CPU, or ``INFERLAB_QUANT_KERNEL`` is
``compiled`` or ``eager``, :func:`available` is False and the callers use the compiled products or
the reference.

``INFERLAB_VNNI_BUILD`` picks a build by name: ``native`` (the default: the CPU's best), ``avx2``,
or ``portable``: ``vnni.c`` compiled with ``vnni_portable.h``, the intrinsics written in plain C,
on any CPU and whatever the capability asked of torch. It is slow and exists for the tests, which
check the loops' arithmetic with it on machines where the real build cannot run.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from inferlab.folders import cache_dir
from inferlab.loop_settings import constant_in_graphs, settings
from inferlab.quant import fused

log = logging.getLogger(__name__)
#: The loops take any number of rows: a decode step's few, and a prompt's hundreds. At 512 rows of a
#: smollm2 projection they measured faster than dequantize-then-matmul in every build (AVX2: Q4_1 4.6
#: against 6.7 ms), and a prompt then meets the same integer arithmetic on every CPU, where a prompt
#: that took the loops on one CPU and the float reference on another would start from other logits.
SOURCE = Path(__file__).with_name("vnni.c")
AVX2_SOURCE = Path(__file__).with_name("avx2.c")
NEON_SOURCE = Path(__file__).with_name("neon.c")
HEADER = Path(__file__).with_name("loops.h")  # what every build includes: the activation quantizer and more
PORTABLE_HEADER = Path(__file__).with_name("vnni_portable.h")
BUILDS = ("native", "avx2", "portable")


def _build(source: Path, flags: tuple[str, ...] = (), depends: tuple[Path, ...] = ()) -> Path:
    """Compile ``source`` (with ``flags``) into a shared library in the cache, once per source, the
    files it includes (``depends``), flags and machine."""
    text = source.read_bytes() + b"".join(d.read_bytes() for d in depends) + " ".join(flags).encode()
    key = hashlib.sha256(text + platform.machine().encode()).hexdigest()[:16]
    lib = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib.parent)
    os.close(fd)
    base = [cc, "-O3", "-shared", "-fPIC", *flags, str(source), "-o", tmp, "-lm"]
    try:  # OpenMP splits the output rows over torch's threads; without it, one thread
        for cmd in (base[:2] + ["-fopenmp"] + base[2:], base):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                os.replace(tmp, lib)  # atomic: a concurrent build never loads half a file
                return lib
        raise OSError((done.stderr.strip().splitlines() or [f"{cc} failed"])[0][:200])
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build() -> str:
    """Which build of the loops is asked for: ``native`` (the CPU's best), ``avx2`` or ``portable``."""
    name = settings().build
    if name not in BUILDS:
        raise ValueError(f"inferlab: INFERLAB_VNNI_BUILD={name!r} is not a build; use one of {', '.join(BUILDS)}")
    return name


@functools.cache
def _portable_library():
    """The portable build, or None where it does not build (no compiler): for the tests."""
    if not fused.compiler_available():
        return None
    try:
        return ctypes.CDLL(str(_build(SOURCE, ("-DINFERLAB_PORTABLE", f"-I{SOURCE.parent}"), (PORTABLE_HEADER, HEADER))))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("inferlab: the portable build of the VNNI loops did not build (%s)", e)
        return None


def _library():
    """The loaded library, or None where it cannot run here (said once, in the log)."""
    return {"portable": _portable_library, "avx2": _avx2_library}.get(build(), _native_library)()


def _x86_library(source: Path, supported: str, what: str):
    """``source`` built for this x86 CPU and loaded, or None: another CPU, no compiler, or a CPU
    without the instructions (``supported`` names the C check)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not fused.compiler_available():
        return None
    try:
        lib = ctypes.CDLL(str(_build(source, (), (HEADER,))))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("inferlab: the %s decode loops did not build (%s); quantized linears use the compiled products", what, e)
        return None
    if not getattr(lib, supported)():
        log.info("inferlab: this CPU has no %s; quantized linears use the compiled products", what)
        return None
    return lib


@functools.cache
def _avx2_library():
    """The AVX2 build, or None where the CPU lacks AVX2, FMA or F16C."""
    return _x86_library(AVX2_SOURCE, "inferlab_avx2_supported", "AVX2")


def _has_dotprod() -> bool:
    """Does this aarch64 CPU have ARMv8.2's dot-product instructions (``asimddp`` in /proc/cpuinfo;
    every Apple-silicon core has them)?"""
    if platform.system() == "Darwin":
        return True
    try:
        return "asimddp" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@functools.cache
def _neon_library():
    """The NEON build for aarch64 (with ``+dotprod`` where the CPU has it), or None."""
    if platform.machine().lower() not in ("aarch64", "arm64") or not fused.compiler_available():
        return None
    try:
        return ctypes.CDLL(str(_build(NEON_SOURCE, ("-march=armv8.2-a+dotprod",) if _has_dotprod() else (), (HEADER,))))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("inferlab: the NEON decode loops did not build (%s); quantized linears use the compiled products", e)
        return None


@functools.cache
def _native_library():
    """The CPU's best build: AVX-512 VNNI, else AVX2 (also when torch is capped below AVX-512); NEON on aarch64."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return _neon_library()
    if os.environ.get("ATEN_CPU_CAPABILITY", "avx512").lower() in ("zvector", "vsx"):
        return None
    if os.environ.get("ATEN_CPU_CAPABILITY", "avx512").lower() not in ("default", "avx2"):
        lib = _x86_library(SOURCE, "inferlab_vnni_supported", "AVX-512 VNNI")
        if lib is not None:
            return lib
    return _avx2_library()


def isa() -> str | None:
    """The instructions the loops run on here: ``avx512-vnni``, ``avx2``, ``neon``, ``neon-dotprod``,
    ``portable`` or None."""
    if not available():
        return None
    lib = _library()
    if lib is _neon_library():
        return "neon-dotprod" if lib.inferlab_neon_dotprod() else "neon"
    return "portable" if lib is _portable_library() else "avx2" if lib is _avx2_library() else "avx512-vnni"


def peak_int8_macs(nthreads: int, seconds: float = 0.05) -> float | None:
    """The CPU's peak rate of 8-bit multiply-adds on ``nthreads`` threads, per second (vpdpbusd on
    AVX-512 VNNI, vpmaddubsw on AVX2), best of 3 runs of about ``seconds``; None where the loops here
    have no such measure (NEON, the portable build, no library)."""
    lib = _library() if available() else None
    if lib is None or not hasattr(lib, "inferlab_peak_int8_macs"):
        return None
    fn = lib.inferlab_peak_int8_macs
    fn.restype, fn.argtypes = ctypes.c_long, (ctypes.c_long, ctypes.c_int)
    iters, best = 10_000, 0.0
    while True:
        t = time.perf_counter()
        macs = fn(iters, nthreads)
        took = time.perf_counter() - t
        if took >= seconds / 4:
            break
        iters *= 4
    for _ in range(3):
        t = time.perf_counter()
        macs = fn(iters, nthreads)
        best = max(best, macs / (time.perf_counter() - t))
    return best


def available() -> bool:
    """Can the VNNI kernels run here (CPU, compiler, ``INFERLAB_QUANT_KERNEL``, the build asked for)?
    Checked once per trace by a compiled step (its value is a constant of the graph)."""
    return fused.mode() == "auto" and _library() is not None


def _usable(x: torch.Tensor, qweight: torch.Tensor) -> bool:
    """Rows of a CPU tensor without autograd, and the kernels here: cheap checks, in the order that
    fails fastest (a decode step calls this for every projection)."""
    return (0 < fused.activation_rows(x) and x.is_cpu and qweight.is_cpu
            and not (x.requires_grad and torch.is_grad_enabled()) and _available())


_available = constant_in_graphs(available)


def _usable_tiles(x: torch.Tensor, tiles: torch.Tensor) -> bool:
    """As :func:`_usable`, for the loops over tiles of 16 outputs (contiguous float32 rows, eager).
    They read each tile once per 4 rows from the cache: a prompt of 512 rows ran a Q4_1 projection
    of smollm2 in 0.9-1.2 ms against 8-9 ms to dequantize the weight and multiply."""
    return (x.dtype is torch.float32 and x.is_contiguous() and not torch.compiler.is_compiling()
            and _usable(x, tiles) and tiles_available())


#: The block types with a loop over tiles of 16 outputs (``inferlab.quant.ggml.block_tiles``).
TILED_TYPES = ("q8_0", "q4_0", "q4_1", "q4_k")


def tiles_available() -> bool:
    """Are there loops over tiles of 16 outputs here (INT8's, INT4's and the TILED_TYPES': the
    AVX-512 and AVX2 builds and the portable one; not the NEON build)?"""
    return available() and hasattr(_library(), "inferlab_q4_1_tiles_gemv")


_FUNCTIONS: dict = {}  # (library, loop name) -> its ctypes function, argument types declared


def _function(name: str, args: tuple):
    """``inferlab_<name>_gemv`` of the library in use, its argument types declared on first use (from
    ``args``: a tensor is a pointer, an int a C int), so a call passes plain ints (a decode step makes
    ~120 of these calls: building ctypes objects and looking the name up each time cost microseconds)."""
    lib = _library()
    loop = _FUNCTIONS.get((lib, name))
    if loop is None:
        loop = getattr(lib, f"inferlab_{name}_gemv")
        ptr, c_int = ctypes.c_void_p, ctypes.c_int
        loop.argtypes = [ptr, c_int, c_int, *(ptr if isinstance(a, torch.Tensor) else c_int for a in args), ptr, c_int]
        _FUNCTIONS[(lib, name)] = loop
    return loop


def _run(name: str, x: torch.Tensor, n_out: int, *args) -> torch.Tensor:
    """Call ``inferlab_<name>_gemv``: every loop takes x, its rows and width, then its own arguments
    (tensors as pointers, ints as C ints), then the output [rows, n_out] and the thread count.
    x [..., K] is read in place as [rows, K] (contiguous), and y is [..., n_out]: no view is made."""
    K = x.shape[-1]
    y = torch.empty((*x.shape[:-1], n_out))
    if _function(name, args)(x.data_ptr(), x.numel() // K, K,
                             *[a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args],
                             y.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"inferlab: the {name} loop could not allocate its activation buffers")
    return y


# The loops as functions of contiguous float32 x [M, K] -> [M, N], each also a torch op
# (``torch.ops.inferlab.<name>_vnni``) that a compiled graph calls.
def int8_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _run("int8", x, qweight.shape[0], qweight, scales, qweight.shape[0])


def int4_gemv(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
              group_size: int) -> torch.Tensor:
    return _run("int4", x, qweight.shape[0], qweight, scales, zeros, qweight.shape[0], group_size)


def ggml_gemv(x: torch.Tensor, qweight: torch.Tensor, ggml_type: str) -> torch.Tensor:
    return _run(ggml_type, x, qweight.shape[0], qweight, qweight.shape[0])


def ggml_tiles_gemv(x: torch.Tensor, tiles: torch.Tensor, n: int, ggml_type: str) -> torch.Tensor:
    return _run(f"{ggml_type}_tiles", x, n, tiles, n)


def nf4_gemv(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor,
             blocksize: int) -> torch.Tensor:
    n = absmax.shape[0] * blocksize // x.shape[-1]  # blocks run over the flattened weight
    return _run("nf4", x, n, qweight, absmax, table, n, blocksize)


BLOCK_TYPES = ("q8_0", "q4_0", "q4_1", "q4_k")  # the llama.cpp block types with a loop here
_OPS = {fn: torch.library.custom_op(f"inferlab::{fn.__name__.replace('_gemv', '')}_vnni", fn, mutates_args=())
        for fn in (int8_gemv, int4_gemv, ggml_gemv, nf4_gemv)}
for _fn, _op in _OPS.items():  # the output's shape, for tracing: [rows, N]
    _op.register_fake((lambda x, q, absmax, table, bs: x.new_empty(x.shape[0], absmax.shape[0] * bs // x.shape[1]))
                      if _fn is nf4_gemv else (lambda x, qweight, *rest: x.new_empty(x.shape[0], qweight.shape[0])))


def _call(fn, x: torch.Tensor, *args) -> torch.Tensor:
    """``fn`` on x viewed as [rows, K] float32: directly when eager (no dispatcher: microseconds
    count at this size), as its custom op inside a compiled step."""
    if x.dtype is torch.float32 and x.is_contiguous() and not torch.compiler.is_compiling():
        return fn(x, *args)  # the common case: x read in place, y made in its final shape
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.float32 or not x2.is_contiguous():
        x2 = x2.float().contiguous()
    y = _OPS[fn](x2, *args) if torch.compiler.is_compiling() else fn(x2, *args)
    y = y if x.dtype == torch.float32 else y.to(x.dtype)
    return y.view(*x.shape[:-1], y.shape[-1])


def int8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """x [..., K] @ (qweight [N, K] int8 * scales [N] fp16)^T with int16 activations per block of 32
    (K a multiple of 32); None: not here."""
    if x.shape[-1] % 32 or scales.dtype != torch.float16 \
            or not (qweight.is_contiguous() and scales.is_contiguous() and _usable(x, qweight)):
        return None
    return _call(int8_gemv, x, qweight, scales)


def int4_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                group_size: int) -> torch.Tensor | None:
    """x [..., K] @ w^T for the ``inferlab.quant.int4`` layout (groups of a multiple of 64) with
    int8 activations per group; None: not here."""
    if group_size % 64 or scales.dtype != torch.float16 or zeros.dtype != torch.uint8 \
            or not (qweight.is_contiguous() and scales.is_contiguous() and zeros.is_contiguous()) \
            or not _usable(x, qweight):
        return None
    return _call(int4_gemv, x, qweight, scales, zeros, group_size)


def ggml_linear(x: torch.Tensor, qweight: torch.Tensor, ggml_type: str) -> torch.Tensor | None:
    """x [..., K] @ w^T for rows of llama.cpp Q8_0, Q4_0, Q4_1 or Q4_K blocks, activations quantized
    per block of 32 (llama.cpp's own scheme); None: another block type, or not here."""
    if ggml_type not in BLOCK_TYPES or not (qweight.is_contiguous() and _usable(x, qweight)):
        return None
    return _call(ggml_gemv, x, qweight, ggml_type)


def int8_tiles_gemv(x: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _run("int8_tiles", x, scales.shape[0], tiles, scales, scales.shape[0])


def int8_tiles_linear(x: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor | None:
    """x [..., K] @ w^T for INT8 codes laid out in tiles of 16 outputs (``inferlab.quant.int8.int8_tiles``)
    with int16 activations per block of 32, eager only; None: not here."""
    if scales.dtype != torch.float16 or not scales.is_contiguous() or not _usable_tiles(x, tiles):
        return None
    return int8_tiles_gemv(x, tiles, scales)


def int4_tiles_gemv(x: torch.Tensor, tiles: torch.Tensor, n: int, group_size: int) -> torch.Tensor:
    return _run("int4_tiles", x, n, tiles, n, group_size)


def int4_tiles_linear(x: torch.Tensor, tiles: torch.Tensor, n: int, group_size: int) -> torch.Tensor | None:
    """x [..., K] @ w^T for INT4 codes laid out in tiles of 16 outputs (``inferlab.quant.int4.int4_tiles``)
    with int8 activations per group, eager only; None: not here."""
    if not _usable_tiles(x, tiles):
        return None
    return int4_tiles_gemv(x, tiles, n, group_size)


def ggml_tiles_linear(x: torch.Tensor, tiles: torch.Tensor, n: int, ggml_type: str) -> torch.Tensor | None:
    """x [..., K] @ w^T for Q8_0, Q4_0, Q4_1 or Q4_K weights laid out in tiles of 16 outputs (``n`` of them, a
    multiple of 16), eager only; None: not here."""
    if ggml_type not in TILED_TYPES or n % 16 or not _usable_tiles(x, tiles):
        return None
    return ggml_tiles_gemv(x, tiles, n, ggml_type)


def nf4_linear(x: torch.Tensor, qweight: torch.Tensor, absmax: torch.Tensor, table: torch.Tensor,
               blocksize: int) -> torch.Tensor | None:
    """x [..., K] @ w^T for NF4 blocks that do not straddle rows (a multiple of 32 dividing K), the
    codes looked up in ``table`` (``inferlab.quant.nf4.nf4_table``: 64 bytes); None: not here."""
    K = x.shape[-1]
    if blocksize % 32 or K % blocksize or absmax.dtype != torch.float32 or table.dtype != torch.uint8 \
            or table.numel() != 64 or not (qweight.is_contiguous() and absmax.is_contiguous() and table.is_contiguous()) \
            or not _usable(x, qweight):
        return None
    return _call(nf4_gemv, x, qweight, absmax, table, blocksize)


def nf4_tiles_gemv(x: torch.Tensor, tiles: torch.Tensor, n: int, blocksize: int) -> torch.Tensor:
    return _run("nf4_tiles", x, n, tiles, n, blocksize)


def nf4_tiles_linear(x: torch.Tensor, tiles: torch.Tensor, n: int, blocksize: int) -> torch.Tensor | None:
    """x [..., K] @ w^T for NF4 laid out in tiles of 16 outputs (``inferlab.quant.nf4.nf4_tiles``), or None."""
    if not _usable_tiles(x, tiles):
        return None
    return nf4_tiles_gemv(x, tiles, n, blocksize)
