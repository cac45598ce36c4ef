#!/usr/bin/env bash
# The GPU check, under 8 minutes on one H200 (the step limits add up to 480 s): the kernel tests
# compiled for the GPU (fp16, bf16), the engine on CUDA with the Triton backend, tensor parallelism
# at TP=1 through its launch path (an NCCL group of one and the parallel layers; greedy tokens equal
# the plain engine's: scripts/tp_check.py), then `python -m inferlab.kernels.bench` (TFLOP/s or
# GB/s per kernel and the ratio to torch's baseline). Needs only the machine's own python with
# torch, triton, pytest, hypothesis, transformers: no package registry.
#   bash scripts/gpu_check.sh            # logs and bench.json under $OUT (default runs/gpu_check)
# Copy $OUT/bench.json to kernels/gpu_results.json to show the numbers in notebook 03 and the book.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export TQDM_DISABLE=1 PYTHONDONTWRITEBYTECODE=1
declare -a SUMMARY=()
FAILED=0

step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $OUT/NAME.log, record the outcome
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name (limit ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  local line="$name: $([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc$([ "$rc" = 124 ] && echo ', timed out'))") in $((SECONDS - t0))s"
  SUMMARY+=("$line")
  [ "$rc" = 0 ] || FAILED=1
  echo "=== $line"
}

# The kernels/ folder imports as inferlab.kernels (setup.py's package_dir). Without installing
# anything, a startup hook maps that name onto the folder.
SHIM=$(mktemp -d)
cat > "$SHIM/sitecustomize.py" <<PYEOF
import importlib.machinery, importlib.util, sys
class _KernelsFinder:
    def find_spec(self, name, path=None, target=None):
        if name == "inferlab.kernels":
            return importlib.util.spec_from_file_location(name, "$PWD/kernels/__init__.py",
                                                          submodule_search_locations=["$PWD/kernels"])
sys.meta_path.insert(0, _KernelsFinder())
PYEOF
export PYTHONPATH="$SHIM:$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU"; exit 2; }
step environment 40 "$PY" -c "
import torch, triton, inferlab.kernels as k
assert torch.cuda.is_available(), 'torch sees no CUDA device'
assert not k.INTERPRETED, 'TRITON_INTERPRET is set: the kernels would run on the CPU'
print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), 'kernels at', k.__file__)"
# one compile per kernel (no autotuning) for the many small test shapes; fp32 dots exact, not TF32
step kernel_tests 150 env INFERLAB_KERNEL_AUTOTUNE=0 TRITON_F32_DEFAULT=ieee "$PY" -m pytest -q -p no:cacheprovider tests/kernels \
  -k "not engine" --junitxml="$OUT/kernel_tests.xml"
# fp32 dots exact (not TF32) so greedy tokens compare kernels, not precisions
step engine_cuda 90 env INFERLAB_KERNEL_AUTOTUNE=0 TRITON_F32_DEFAULT=ieee "$PY" -m pytest -q -p no:cacheprovider tests/kernels -k engine
# TP=1 through the TP launch path (NCCL), against the plain engine; only where torch sees CUDA
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  step tensor_parallel 45 "$PY" scripts/tp_check.py --device cuda
else
  SUMMARY+=("tensor_parallel: SKIPPED (torch sees no CUDA device)")
fi
step bench 155 "$PY" -m inferlab.kernels.bench --json "$OUT/bench.json"

echo
echo "================ GPU check summary ================"
printf '%s\n' "${SUMMARY[@]}"
[ -f "$OUT/bench.log" ] && sed -n '/^goals:/,$p' "$OUT/bench.log"
rm -rf "$SHIM"
exit $FAILED
