#!/usr/bin/env bash
# `make test-gpu`: the `gpu`-marked tests and the real-GPU scenario (scripts/gpu_scenario.py) in
# one command, on any machine with an NVIDIA GPU, torch and nvidia-ml-py; no vLLM. Without a GPU
# it prints one line and exits 0.
#
# GPU_PYTHON: the interpreter with torch (default: the first of .venv/bin/python and python3 that
# imports torch and pynvml). The tests run on the project's venv where there is one (they need
# its dependencies, not torch), else on GPU_PYTHON.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ ! -e /proc/driver/nvidia/version ]] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "make test-gpu: skipped: no NVIDIA GPU here (no /proc/driver/nvidia/version, no nvidia-smi)"
    exit 0
fi

has() { "$1" -c "import $2" >/dev/null 2>&1; }
GPU_PYTHON="${GPU_PYTHON:-}"
if [[ -z "$GPU_PYTHON" ]]; then
    for candidate in .venv/bin/python python3; do
        if command -v "$candidate" >/dev/null && has "$candidate" "torch, pynvml"; then
            GPU_PYTHON="$candidate"
            break
        fi
    done
fi
if [[ -z "$GPU_PYTHON" ]]; then
    echo "make test-gpu: an NVIDIA driver is here but no python imports torch and pynvml" \
        "(nvidia-ml-py); set GPU_PYTHON" >&2
    exit 2
fi
TEST_PYTHON="$GPU_PYTHON"
[[ -x .venv/bin/python ]] && TEST_PYTHON=.venv/bin/python

count=$("$GPU_PYTHON" -c "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())" 2>&1)
if [[ ! "$count" =~ ^[1-9][0-9]*$ ]]; then
    echo "make test-gpu: skipped: the NVIDIA driver lists no usable GPU ($count)"
    exit 0
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 SIDECAR_TEST_GPU=1
# Only the modules that hold gpu-marked tests are collected: a GPU machine need not carry every
# dev dependency of the suite (kubernetes-validate, hadolint) to run these.
mapfile -t gpu_modules < <(grep -l "pytest.mark.gpu" tests/test_*.py)
echo "== gpu-marked tests ($TEST_PYTHON: ${gpu_modules[*]})"
"$TEST_PYTHON" -m pytest -q -m gpu -p no:cacheprovider "${gpu_modules[@]}"
tests_rc=$?
echo "== real-GPU scenario ($GPU_PYTHON)"
timeout 150 "$GPU_PYTHON" -m scripts.gpu_scenario
scenario_rc=$?
if (( tests_rc != 0 || scenario_rc != 0 )); then
    echo "make test-gpu: FAILED (tests rc=$tests_rc, scenario rc=$scenario_rc)"
    exit 1
fi
echo "make test-gpu: passed"
