#!/usr/bin/env bash
# The checks that need a GPU, in one go (CI has none): the Triton kernel tests compiled for
# the device, the kernel benchmark, the training benchmark's CUDA mode, and a short real
# training run through `training.train` (megatron as shipped, bf16).
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#
# Wheels in .whl/ (e.g. megatron-core, webdataset for a machine that lacks them) are installed
# into a private folder first. Each step's output goes to OUT_DIR (default ./gpu-checks); a
# failing step is reported and the next one still runs.
set -u
out=${1:-gpu-checks}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc in $((SECONDS - started)) s"
    tail -n 25 "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, megatron.core as m; print('torch', torch.__version__, 'triton', triton.__version__, 'megatron-core', m.__version__)"
step kernel_tests 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_*.py tests/test_model_kernels.py
step bench_kernels 300 python3 benchmarks/bench_kernels.py --iters 10
step bench_train 300 python3 benchmarks/bench_train.py --device cuda
step train_smoke 240 python3 benchmarks/gpu_train_smoke.py
step step_check 240 python3 benchmarks/gpu_step_check.py
