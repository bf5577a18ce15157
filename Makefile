# Every target builds or refreshes the project's own virtual environment first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check docs bench soak test-vllm plan clean lock compiled test-compiled

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,demo]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The compiled build (setup.py, SIDECAR_COMPILE=1: the image's), made in a copy of the tree, and the
# whole suite run on it; tests/test_compiled_build.py checks that it really is the compiled one.
COMPILED := .build/compiled
compiled: $(STAMP)
	bash scripts/compiled_tree.sh $(COMPILED) $(abspath $(BIN))/python

test-compiled: compiled
	cd $(COMPILED) && EXPECT_COMPILED_BUILD=1 PYTHONPATH=$(abspath $(COMPILED)) \
		$(abspath $(BIN))/python -m pytest -q

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
# moves the figures by 4-28% (docs/performance.md).
BENCH_PYTHON ?=
# BENCH_COMPILED=1: the benchmarks run from the compiled tree (`make compiled`), and so does the
# sidecar they start; their JSON is then under .build/compiled/.bench.
BENCH_COMPILED ?=
ifeq ($(strip $(BENCH_COMPILED)),1)
BENCH_DEPS := compiled
BENCH_FROM := cd $(COMPILED) && PYTHONPATH=$(abspath $(COMPILED))
else
BENCH_DEPS :=
BENCH_FROM := true &&
endif
ifeq ($(strip $(BENCH_PYTHON)),)
bench: $(STAMP) $(BENCH_DEPS)
	$(BENCH_FROM) $(abspath $(BIN))/python -m benchmarks
else
bench: $(STAMP) $(BENCH_DEPS)
	@if [ "$$(cat .venv-bench/.python 2>/dev/null)" != "$(BENCH_PYTHON)" ] \
		|| [ pyproject.toml -nt .venv-bench/.python ]; then \
		$(BENCH_PYTHON) -m venv --clear --without-pip .venv-bench \
		&& $(BIN)/python -m pip --python .venv-bench/bin/python install -q -e '.[dev,demo]' \
		&& echo '$(BENCH_PYTHON)' > .venv-bench/.python; fi
	$(BENCH_FROM) $(abspath .venv-bench)/bin/python -m benchmarks
endif

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
	rm -rf $(VENV) .venv-bench .build .mypy_cache .ruff_cache .pytest_cache
