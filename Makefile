# Every target builds or refreshes the project's own virtual environment first, every package at
# the version constraints.txt pins (`make lock` refreshes it), so a fresh machine gets what CI ran.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check docs bench bench-venv bench-overload bench-burst bench-capacity bench-cold-start bench-fleet bench-slow-clients bench-audit soak test-vllm test-image test-gpu plan clean lock

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,demo]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m demo

# PYTEST_ARGS="-n 4": the suite on four worker processes (pytest-xdist), as CI runs it.
PYTEST_ARGS ?=
test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

check: $(STAMP)
	$(BIN)/ruff check sidecar emulator demo tests benchmarks scripts tests_vllm
	$(BIN)/ruff format --check sidecar emulator demo tests benchmarks scripts tests_vllm
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache

# The reference pages made from the code (docs/settings.md, docs/metrics.md); a test checks them.
docs: $(STAMP)
	$(BIN)/python -m scripts.gen_docs

# BENCH_PYTHON=/usr/bin/python3.11: the benchmarks (and so the sidecar they start) on that
# interpreter, from a venv of its own (.venv-bench, made again when BENCH_PYTHON or pyproject.toml
# changes). The image's CPython is built with PGO and LTO; pyenv's default build is not, and that
# moves the figures (docs/benchmarks.md).
BENCH_PYTHON ?=
# Where scripts/vllm_env.sh and scripts/test_vllm.sh keep the vLLM venv and the tiny model.
export E2E_VLLM_VENV ?= $(HOME)/.cache/gpu-sidecar/vllm-venv
export E2E_TINY_MODEL ?= $(HOME)/.cache/gpu-sidecar/tiny-llama
E2E_VLLM_PYTHON := $(E2E_VLLM_VENV)/bin/python
ifeq ($(strip $(BENCH_PYTHON)),)
BENCH_BIN := $(BIN)
BENCH_VENV :=
else
BENCH_BIN := .venv-bench/bin
BENCH_VENV := bench-venv
endif

bench: $(STAMP) $(BENCH_VENV)
	$(BENCH_BIN)/python -m benchmarks

bench-venv: $(STAMP)
	@if [ "$$(cat .venv-bench/.python 2>/dev/null)" != "$(BENCH_PYTHON)" ] \
		|| [ pyproject.toml -nt .venv-bench/.python ]; then \
		$(BENCH_PYTHON) -m venv --clear --without-pip .venv-bench \
		&& $(BIN)/python -m pip --python .venv-bench/bin/python install -q -c constraints.txt \
			-e '.[dev,demo]' \
		&& echo '$(BENCH_PYTHON)' > .venv-bench/.python; fi

# Thousands of hostile and faulty requests; SOAK_REQUESTS sets the size (default 10000).
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak

# SLO goodput under overload: the sidecar against vLLM alone and its queue cap, on a real vLLM
# (CPU) and a GPU-shaped emulated engine, 3 repetitions interleaved
# (docs/lab/overload.md), and the engine alone at 24, 36 and 48 clients for its best operating
# point: about 70 min on 2 cores. OVERLOAD_LOADS, OVERLOAD_CONFIGS, OVERLOAD_MEASURE_S,
# OVERLOAD_REPETITIONS, OVERLOAD_SWEEP (client counts, or none) narrow it; OVERLOAD_SIDECAR_QUOTA=1
# OVERLOAD_NEIGHBOUR=1 run each sidecar in a cgroup under one core's quota beside a busy neighbour
# (root). Writes .bench/overload.json (every request), .md and .png.
bench-overload: $(STAMP)
	bash scripts/vllm_env.sh
	$(E2E_VLLM_PYTHON) scripts/build_tiny_model.py $(E2E_TINY_MODEL)
	$(BIN)/python -m benchmarks.overload

# A burst of 96 streaming chats onto a fresh pod, after light use, after a burst and after a long
# idle, beside the engine alone (real vLLM on CPU and the GPU-shaped emulated engine), each user
# honouring busy answers' hints up to 8 times: about 20 min an engine on 2 cores
# (docs/lab/burst.md). BURST_ENGINES, BURST_CASES, BURST_REPETITIONS narrow it.
bench-burst: $(STAMP)
	bash scripts/vllm_env.sh
	$(E2E_VLLM_PYTHON) scripts/build_tiny_model.py $(E2E_TINY_MODEL)
	$(BIN)/python -m benchmarks.burst

# Does the sidecar let a GPU-shaped emulated engine serve what it serves alone within SLO? A sweep
# of closed-loop users straight at it finds its capacity, then users step through 25-150 % of it
# through a sidecar and straight at the engine. About 8 min (docs/lab/burst.md).
bench-capacity: $(STAMP)
	$(BIN)/python -m benchmarks.capacity_sweep

# A fleet of GPU-shaped emulated pods behind nginx, scaled by the HPA algorithm on the shipped
# KEDA object (deploy/k8s, read at run time): the sidecar's signal against vLLM's queue and KV
# use, a static fleet and an oracle, on a step, a burst and a ramp, every interval compressed by
# FLEET_TIME_SCALE (default 10). About 90 min on 2 cores at the defaults; FLEET_CASES,
# FLEET_CONFIGS, FLEET_REPETITIONS narrow it (docs/autoscaling.md). Needs nginx (nginx-light).
# Writes .bench/fleet.json, .md and .png.
bench-fleet: $(STAMP)
	$(BIN)/python -m benchmarks.fleet

# 96 clients without max_tokens through a fresh sidecar to an H200-sized emulated engine: how many
# run at the engine within 5 s (target >= 48). About 20 s.
bench-cold-start: $(STAMP)
	$(BIN)/python -m benchmarks.cold_start

# Clients that never finish (slowhttptest's slow headers, slow body and slow read, and bodies in
# 1-byte TCP segments) against the sidecar, nginx and HAProxy, each in front of the emulated engine:
# a legitimate client served or not, and each proxy's peak RSS. About 6 min (docs/lab/reliability.md).
# Needs slowhttptest and nginx (nginx-light); HAProxy is skipped where not installed.
# SLOW_CONNECTIONS, SLOW_SECONDS, SLOW_ATTACKS, SLOW_PROXIES narrow it.
bench-slow-clients: $(STAMP)
	$(BIN)/python -m benchmarks.slow_clients

# Issue 48's audit rows 1-5 at their full widths (pipelined GETs and streamed chats never read,
# slow readers, slow bodies, 2-byte chunks), each against a fresh sidecar at its defaults in front
# of the emulated engine, legit clients on another address and on the attacker's: served, latency,
# peak RSS against the issue's targets, PASS or MISS. About 3 min (docs/lab/reliability.md).
# AUDIT_ROWS, AUDIT_SCALE (0.02: a smoke run), AUDIT_SECONDS narrow it. Writes
# .bench/audit.json and .md.
bench-audit: $(STAMP)
	$(BIN)/python -m benchmarks.audit_rows

test-vllm: $(STAMP)
	bash scripts/test_vllm.sh

# The Dockerfile's image built without Docker (a Debian base from debootstrap, podman with runc)
# and run as uid 10001 with a read-only root: `sidecar --version`, one chat completion through it
# to the emulated engine. Root, podman, runc and debootstrap; about a minute (docs/deploy.md).
test-image: $(STAMP)
	bash scripts/test_image.sh

# The `gpu`-marked tests and a real-GPU scenario (a process holding memory as vLLM lays it out, a
# neighbour coming and going, the engine's process gone), under 3 minutes, on any machine with an
# NVIDIA GPU, torch and nvidia-ml-py; one line and exit 0 without a GPU (docs/live-capacity.md).
# GPU_PYTHON=... names the interpreter that has torch.
test-gpu:
	bash scripts/test_gpu.sh

# The pins, resolved from PyPI alone, whatever pip.conf says: the image's hash-locked dependencies
# (Dockerfile), and constraints.txt, every package the dev, test and demo venv installs.
COMPILE := PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= $(BIN)/pip-compile --quiet --strip-extras \
	--no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple --upgrade
LOCK := $(COMPILE) --generate-hashes
lock: $(STAMP)
	$(LOCK) -o deploy/docker/requirements.lock pyproject.toml
	$(LOCK) --allow-unsafe -o deploy/docker/build-requirements.lock deploy/docker/build-requirements.in
	$(COMPILE) --allow-unsafe --extra dev --extra demo -o constraints.txt pyproject.toml

clean:
	rm -rf $(VENV) .venv-bench .mypy_cache .ruff_cache .pytest_cache
