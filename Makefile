# Every target builds or refreshes the project's own virtual environment first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check docs bench bench-venv soak test-vllm plan clean lock

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,demo]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

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
		&& $(BIN)/python -m pip --python .venv-bench/bin/python install -q -e '.[dev,demo]' \
		&& echo '$(BENCH_PYTHON)' > .venv-bench/.python; fi

# Thousands of hostile and faulty requests; SOAK_REQUESTS sets the size (default 10000).
soak: $(STAMP)
	$(BIN)/python -m benchmarks.soak

test-vllm: $(STAMP)
	bash scripts/test_vllm.sh

# The image's hash-locked dependencies (Dockerfile), resolved from PyPI alone, whatever pip.conf says.
LOCK := PIP_CONFIG_FILE=/dev/null $(BIN)/pip-compile --quiet --generate-hashes --strip-extras \
	--no-emit-index-url --no-emit-find-links --index-url https://pypi.org/simple
lock: $(STAMP)
	$(LOCK) --upgrade -o deploy/docker/requirements.lock pyproject.toml
	$(LOCK) --upgrade --allow-unsafe -o deploy/docker/build-requirements.lock deploy/docker/build-requirements.in

clean:
	rm -rf $(VENV) .venv-bench .mypy_cache .ruff_cache .pytest_cache
