#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one go: the gpu-marked tests, S6 (TorchScript) on
# CUDA and S4 with CUDA shared memory. Runs with the `python3` on PATH, which must have torch
# with CUDA, numpy, pytest and the test clients; openinfer must be importable (an installed
# wheel, or PYTHONPATH). Logs and results go to OUTDIR (default build/gpu-check).
#
#     scripts/gpu_check.sh [OUTDIR]
#
# Each step runs under its own time limit and a failed step does not stop the next.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-build/gpu-check}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS CMD...: the command's output to the terminal and OUTDIR/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUTDIR/$name.log"
    echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
}

step facts 60 bash -c 'nvidia-smi -L; python3 -c "import sys, torch, numpy, openinfer
print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"-\", \"numpy\", numpy.__version__, openinfer.__file__)"'
# The libtorch shim compiled once, into the package, before any test times a load.
step shim 240 python3 -c 'import os, openinfer, openinfer._torch_build as b
print(b.build(os.path.dirname(openinfer.__file__)))'
step tests 300 python3 -m pytest -p no:cacheprovider -q -rs -m gpu \
    tests/test_torch.py tests/test_shared_memory.py tests/test_client_shm.py tests/test_onnx.py tests/test_statistics.py
step s6 240 python3 benchmarks/s6_torchscript.py --device cuda --peers none --rounds 3 --duration 2 \
    --out "$OUTDIR"
step s4 150 python3 benchmarks/s4_cuda_shm.py --rounds 3 --seconds 1 --out "$OUTDIR"
