#!/usr/bin/env bash
# The checks that need a GPU, in one go (CI has none), within 10 minutes on one H200: the
# Triton kernel tests compiled for the device, our kernels against Liger-Kernel, training
# throughput against a compiled plain GPT and in FP8 against our bf16 (350M and 1B shapes, MFU,
# each step's peak memory), a short real training run through `training.train` in bf16 and in
# FP8, and megatron's step against the plain one. On 2026-12-04 (H200) bench_kernels took 112 s,
# bench_train_1b 41 s and bench_train_350m 34 s, without the FP8 variant.
#
#   bash benchmarks/gpu_checks.sh [--dry-run] [OUT_DIR]
#
# Wheels in .whl/ (what the steps import beyond a bare CUDA torch image: `python benchmarks/gpu_wheels.py`
# downloads them for the GPU's Python, 32 wheels, 48.8 MiB; carry .whl with the run) are installed into a
# private folder first. Each step's log goes to OUT_DIR (default ./gpu-checks); a
# failing step is reported and the next one still runs, and the exit status is 1 if any failed.
# At the end every step's last JSON line is gathered into benchmarks/results/<device>-<date>.json
# (and OUT_DIR), the file the README's Performance section and docs/performance.md quote once it
# is committed. $PYTHON (default python3) runs every step.
#
# --dry-run (default OUT_DIR ./gpu-checks-dry-run; tests/test_gpu_checks_dry_run.py runs it in CI):
# the same steps, in the same order, with the same flags, plus the ones that run each on CPU at
# tiny shapes, so that a lent GPU's minutes go to measuring, not to fixing this script. No
# nvidia-smi, no wheels, CUDA hidden; the results file is marked as a dry run and written to
# OUT_DIR only. Its figures mean nothing; it takes 93-160 s on 2 cores (docs/performance.md).
set -u
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
    dry_run=1
    shift
fi
if ((dry_run)); then out=${1:-gpu-checks-dry-run}; else out=${1:-gpu-checks}; fi
py=${PYTHON:-python3}
mkdir -p "$out"
: >"$out/steps.tsv"
failed=0
# A step's time limit is its GPU budget; in the dry run three times that: on CPU a limit only catches a
# hang (the figures say nothing of the GPU's), and a cold Inductor cache (bench_train_350m: 40-47 s on 2
# cores) or a busy CI machine must not time a working step out.
limit_scale=1
((dry_run)) && limit_scale=3

if ((dry_run)); then
    # The wheels are built for the GPU machine's Python and stack: here they would shadow the
    # interpreter's own packages with ones it cannot load. CUDA hidden: a dry run on a GPU machine
    # is still a CPU run.
    export PYTHONPATH=$PWD CUDA_VISIBLE_DEVICES=
elif compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/gpu-site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout "$((limit * limit_scale))" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    ((rc == 0)) || failed=1
    printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - started))" >>"$out/steps.tsv"
    echo "== $name: exit $rc in $((SECONDS - started)) s"
    tail -n 25 "$out/$name.log"
}

# What the dry run adds to each step's own command. argparse takes the last of a repeated flag, so
# `--device cuda --size 350m ... --device cpu --size tiny` runs tiny on CPU with every other flag
# (--profile, --no-loader) as on the GPU.
kernel_tests=(-m pytest -q -x -p no:cacheprovider tests/test_kernels_*.py tests/test_model_kernels.py)
kernels_cpu=() train_cpu=() script_cpu=() collect_cpu=()
if ((dry_run)); then
    echo "cpu dry run" | tee "$out/device.txt"
    kernels_cpu=(--dry-run-cpu)
    train_cpu=(--device cpu --size tiny --compile-backend eager)  # Dynamo traces; Inductor's C++ build is the suite's cost
    script_cpu=(--dry-run)
    collect_cpu=(--dry-run)  # written to OUT_DIR only, marked as a dry run
else
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
fi
# The versions from the installed metadata (importing torch, triton and megatron-core only to print them took 7 s
# of CPU in the dry run); every step imports them.
"$py" -c "from importlib.metadata import version as v; print(*(f'{d} {v(d)}' for d in ('torch', 'triton', 'megatron-core', 'torchao')))" || failed=1
# Limits add up to 9 min 30 s (the 1b figures first: they are the goal's), the rest of 10 minutes for the wheels;
# the 2026-12-04 run took about 4 min of them.
if ((dry_run)); then
    # The kernel tests run in the suite already (interpreted); all of them once more take 72 s on 2 cores,
    # most of this dry run's budget: every one is collected (their imports and parameters, as on the
    # GPU) and one small file of them runs, interpreted (about 10 s).
    step kernel_tests 60 env TRITON_INTERPRET=1 "$py" "${kernel_tests[@]}" -k test_kernels_swiglu
else
    step kernel_tests 60 "$py" "${kernel_tests[@]}"
fi
# bench_train compiles ours and the plain peer (Inductor, cold on a fresh machine: about a minute each at
# 1b); the checkpoint stall has its own GPU result (results/gpu-bench_checkpoint-2026-12-04.json).
step bench_kernels 120 "$py" benchmarks/bench_kernels.py --iters 10 "${kernels_cpu[@]}"
# FP8 (train.precision: fp8, tensorwise: torchao's fastest recipe) beside bf16 in the same run, rotated.
step bench_train_1b 180 "$py" benchmarks/bench_train.py --device cuda --size 1b --profile --fp8 tensorwise --no-loader --no-checkpoint "${train_cpu[@]}"
step bench_train_350m 105 "$py" benchmarks/bench_train.py --device cuda --size 350m --fp8 tensorwise --no-loader --no-checkpoint "${train_cpu[@]}"
step train_smoke 60 "$py" benchmarks/gpu_train_smoke.py --fp8 "${script_cpu[@]}"
step step_check 45 "$py" benchmarks/gpu_step_check.py "${script_cpu[@]}"
"$py" benchmarks/collect_results.py "$out" "${collect_cpu[@]}" || failed=1
if ((failed)); then
    echo "== gpu_checks: a step failed (steps.tsv, the logs in $out)"
fi
exit "$failed"
