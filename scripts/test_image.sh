#!/usr/bin/env bash
# `make test-image`: build the Dockerfile's image without Docker and serve one request through it.
#
# No container registry is needed: the base image (the Dockerfile's PYTHON_IMAGE) is made from
# Debian's own packages with debootstrap (bookworm, python3 3.11), podman builds the Dockerfile
# on it (the build fetches the locked wheels from PyPI), and the image then runs as uid 10001
# with a read-only root, no capabilities and no new privileges: `sidecar --version`, then
# `sidecar serve` in front of the emulated engine (on this host's loopback), one chat completion
# through its proxy port, /metrics refused there. Needs root, podman, runc and debootstrap
# (apt-get install podman runc debootstrap).
#
#   E2E_BASE_IMAGE  the base image to build on (default localhost/debian-python:3.11-bookworm,
#                   made with debootstrap when missing; python:3.11.14-slim-bookworm where a
#                   registry is reachable)
#   E2E_PYTHON      the interpreter that runs the emulated engine (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

BASE="${E2E_BASE_IMAGE:-localhost/debian-python:3.11-bookworm}"
IMAGE=localhost/gpu-admission-sidecar:test
PYTHON="${E2E_PYTHON:-$ROOT/.venv/bin/python}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/test-image.XXXXXX")"
EMULATOR_PID=""
CONTAINER=""

# crun refuses hosts with hybrid cgroups (v1 controllers beside a v2 mount); runc runs there.
# podman raises RLIMIT_NOFILE and RLIMIT_NPROC by default, which a sandboxed host may forbid
# ("setrlimit RLIMIT_NOFILE: Operation not permitted"): this shell's own file limit, and a
# process limit far above what the sidecar's one process needs.
PODMAN=(podman --runtime runc)
LIMITS=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
LOCKED=(--user 10001:10001 --read-only --cap-drop ALL --security-opt no-new-privileges)

say() { echo "test_image: $*" >&2; }

cleanup() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        tail -n 20 "$WORK"/*.log >&2 || true
        [[ -z "$CONTAINER" ]] || "${PODMAN[@]}" logs "$CONTAINER" 2>&1 | tail -n 40 >&2 || true
    fi
    if [[ -n "$CONTAINER" ]]; then
        "${PODMAN[@]}" rm -f "$CONTAINER" >/dev/null || true
    fi
    if [[ -n "$EMULATOR_PID" ]]; then
        kill -TERM "$EMULATOR_PID" 2>/dev/null || true
        wait "$EMULATOR_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || { say "$tool is not installed (apt-get install podman runc debootstrap)"; exit 1; }
done

if ! podman image exists "$BASE"; then
    say "making $BASE from Debian packages (debootstrap, about a minute)"
    debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log"
    rm -rf "$WORK"/rootfs/var/cache/apt/archives/*.deb "$WORK"/rootfs/var/lib/apt/lists/*
    tar -C "$WORK/rootfs" -c . | podman import --change 'CMD ["python3"]' - "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
fi

# The host's CA bundle and pip.conf (where a proxy inspects TLS, they name its certificate) are
# mounted for the build's RUN steps only; they are not copied into the image.
TRUST=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
[[ -f /etc/pip.conf ]] && TRUST+=(-v /etc/pip.conf:/etc/pip.conf:ro)
say "building $IMAGE on $BASE"
"${PODMAN[@]}" build "${LIMITS[@]}" "${TRUST[@]}" --build-arg "PYTHON_IMAGE=$BASE" \
    -t "$IMAGE" -f Dockerfile . >"$WORK/build.log"

say "$("${PODMAN[@]}" run --rm "${LIMITS[@]}" "${LOCKED[@]}" --entrypoint sidecar "$IMAGE" --version)"

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
ENGINE_PORT="$(free_port)"
PROXY_PORT="$(free_port)"
ADMIN_PORT="$(free_port)"
PYTHONPATH="$ROOT" "$PYTHON" -m emulator --port "$ENGINE_PORT" >"$WORK/emulator.log" 2>&1 &
EMULATOR_PID=$!
CONTAINER="$("${PODMAN[@]}" run -d "${LIMITS[@]}" "${LOCKED[@]}" --network host \
    -e "SIDECAR_UPSTREAM_URL=http://127.0.0.1:$ENGINE_PORT" -e SIDECAR_CAPACITY_SOURCE=vllm \
    -e SIDECAR_HOST=127.0.0.1 -e "SIDECAR_PORT=$PROXY_PORT" \
    -e SIDECAR_ADMIN_HOST=127.0.0.1 -e "SIDECAR_ADMIN_PORT=$ADMIN_PORT" "$IMAGE")"

# status <method> <url> [body]: the HTTP status of one request (000 when nothing answers).
status() {
    "$PYTHON" - "$@" <<'EOF'
import sys, urllib.error, urllib.request
method, url, body = sys.argv[1], sys.argv[2], (sys.argv[3].encode() if len(sys.argv) > 3 else None)
request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method=method)
try:
    with urllib.request.urlopen(request, timeout=10) as response:
        print(response.status)
except urllib.error.HTTPError as exc:
    print(exc.code)
except OSError:
    print("000")
EOF
}

for _ in $(seq 120); do
    [[ "$(status GET "http://127.0.0.1:$ADMIN_PORT/readyz")" == 200 ]] && break
    sleep 0.5
done
CHAT='{"model": "emulated-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'
chat="$(status POST "http://127.0.0.1:$PROXY_PORT/v1/chat/completions" "$CHAT")"
metrics="$(status GET "http://127.0.0.1:$PROXY_PORT/metrics")"
whoami="$("${PODMAN[@]}" exec "$CONTAINER" id -u)"
say "uid $whoami, chat completion $chat, engine /metrics through the proxy $metrics"
[[ "$whoami" == 10001 && "$chat" == 200 && "$metrics" == 404 ]]
say "passed"
