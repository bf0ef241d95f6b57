#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one go: the gpu-marked tests (TorchScript, PT2
# packages compiled for CUDA, ONNX Runtime's CUDA execution provider, CUDA shared memory),
# S6 (TorchScript) and S14 (PT2) on CUDA, S6 again with as many server threads as the machine
# has cores to spare (so dynamic batching is bounded by the GPU, not one core's HTTP), S12
# (ONNX) on CUDA where onnxruntime has its CUDA provider, and S4 with CUDA shared memory. Runs
# with the `python3` on PATH, which must have torch with CUDA, numpy, pytest and the test
# clients; openinfer must be importable (an installed wheel, or PYTHONPATH). Logs and results
# go to OUTDIR (default build/gpu-check).
#
#     scripts/gpu_check.sh [OUTDIR]
#
# Each step runs under its own time limit and a failed step does not stop the next. Without a
# GPU (or without what a step needs) each step says it is skipped and why, so the script runs
# end to end anywhere.
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
skip() {  # skip NAME WHY
    echo "=== $1: skipped: $2" | tee "$OUTDIR/$1.log"
}

# Why the GPU steps cannot run here, or nothing when they can.
no_gpu=""
if ! command -v nvidia-smi >/dev/null 2>&1; then
    no_gpu="no nvidia-smi on PATH (no NVIDIA driver)"
elif ! nvidia-smi -L >/dev/null 2>&1; then
    no_gpu="nvidia-smi lists no GPU"
elif ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    no_gpu="python3's torch sees no CUDA GPU (a CPU build of torch, or no torch)"
fi
no_ort_cuda=$no_gpu
if [ -z "$no_gpu" ] && ! python3 -c 'import sys, onnxruntime as o
sys.exit(0 if "CUDAExecutionProvider" in o.get_available_providers() else 1)' 2>/dev/null; then
    no_ort_cuda="the installed onnxruntime has no CUDA execution provider (pip install onnxruntime-gpu)"
fi
gpu_step() {  # gpu_step NAME SECONDS CMD...: a step, or its skip when there is no GPU
    if [ -n "$no_gpu" ]; then skip "$1" "$no_gpu"; else step "$@"; fi
}
# Cores for S6 with many loop threads: all but two for the server, two for wrk.
cores=$(nproc)
server_cpus="0-$((cores > 3 ? cores - 3 : 0))"
client_cpus="$((cores > 3 ? cores - 2 : 0))-$((cores - 1))"
server_threads=$((cores > 3 ? cores - 2 : 1))

step facts 60 bash -c 'nvidia-smi -L || true; python3 -c "import sys, torch, numpy, openinfer
print(sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"-\", \"numpy\", numpy.__version__, openinfer.__file__)"'
# The libtorch shim compiled once, into the package, before any test times a load.
gpu_step shim 240 python3 -c 'import os, openinfer, openinfer._torch_build as b
print(b.build(os.path.dirname(openinfer.__file__)))'
gpu_step tests 420 python3 -m pytest -p no:cacheprovider -q -rs -m gpu \
    tests/test_torch.py tests/test_torch_aoti.py tests/test_shared_memory.py tests/test_client_shm.py \
    tests/test_onnx.py tests/test_statistics.py
gpu_step s6 240 python3 benchmarks/s6_torchscript.py --device cuda --peers none --rounds 3 --duration 2 \
    --out "$OUTDIR"
gpu_step s6_cores 240 python3 benchmarks/s6_torchscript.py --device cuda --peers none --rounds 3 --duration 2 \
    --models mlp --threads "$server_threads" --server-cpu "$server_cpus" --client-cpu "$client_cpus" \
    --wrk-threads 2 --connections 64 --out "$OUTDIR"
gpu_step s14 300 python3 benchmarks/s14_pt2.py --device cuda --rounds 3 --duration 2 --out "$OUTDIR"
if [ -n "$no_ort_cuda" ]; then
    skip s12 "$no_ort_cuda"
else
    step s12 240 python3 benchmarks/s12_onnx.py --device cuda --rounds 3 --duration 2 --out "$OUTDIR"
fi
gpu_step s4 150 python3 benchmarks/s4_cuda_shm.py --rounds 3 --seconds 1 --out "$OUTDIR"
