#!/usr/bin/env bash
# The checks that need a GPU, in one go (CI has none), within 8 minutes on one H200: the
# Triton kernel tests compiled for the device, our kernels against Liger-Kernel, training
# throughput against a compiled plain GPT (350M and 1B shapes, MFU), a short real training
# run through `training.train`, and megatron's step against the plain one.
#
#   bash benchmarks/gpu_checks.sh [OUT_DIR]
#
# Wheels in .whl/ (e.g. megatron-core, liger-kernel for a machine that lacks them) are installed
# into a private folder first. Each step's log goes to OUT_DIR (default ./gpu-checks); a
# failing step is reported and the next one still runs. At the end every step's last JSON
# line is gathered into benchmarks/results/<device>-<date>.json (and OUT_DIR), the file the
# README's Performance section and docs/performance.md quote once it is committed.
set -u
out=${1:-gpu-checks}
mkdir -p "$out"
: >"$out/steps.tsv"
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
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" >>"$out/steps.tsv"
    echo "== $name: exit $rc in $((SECONDS - started)) s"
    tail -n 25 "$out/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, triton, megatron.core as m; print('torch', torch.__version__, 'triton', triton.__version__, 'megatron-core', m.__version__)"
# Budgets add up to 7 min 30 s, leaving the rest of the 8 minutes for the wheels and start-up.
step kernel_tests 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_*.py tests/test_model_kernels.py
step bench_kernels 150 python3 benchmarks/bench_kernels.py --iters 10
step bench_train_350m 60 python3 benchmarks/bench_train.py --device cuda --size 350m --no-loader
step bench_train_1b 90 python3 benchmarks/bench_train.py --device cuda --size 1b --profile --no-loader
step train_smoke 45 python3 benchmarks/gpu_train_smoke.py
step step_check 45 python3 benchmarks/gpu_step_check.py
python3 benchmarks/collect_results.py "$out"
