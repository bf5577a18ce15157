# Every target builds or refreshes the project's own virtual environment first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test check docs bench bench-venv bench-compiled soak test-vllm plan clean lock compiled test-compiled

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
# BENCH_COMPILED=1: the benchmarks run from a compiled tree, and so does the sidecar they start;
# their JSON is then under that tree's .bench. The tree is built by the interpreter that runs it:
# .build/compiled (`make compiled`) for the project's venv, .build/compiled-bench for BENCH_PYTHON's.
BENCH_COMPILED ?=
ifeq ($(strip $(BENCH_PYTHON)),)
BENCH_BIN := $(abspath $(BIN))
BENCH_VENV :=
BENCH_TREE := $(COMPILED)
else
BENCH_BIN := $(abspath .venv-bench)/bin
BENCH_VENV := bench-venv
BENCH_TREE := .build/compiled-bench
endif
ifeq ($(strip $(BENCH_COMPILED)),1)
BENCH_DEPS := bench-compiled
BENCH_FROM := cd $(BENCH_TREE) && PYTHONPATH=$(abspath $(BENCH_TREE))
else
BENCH_DEPS :=
BENCH_FROM := true &&
endif

bench: $(STAMP) $(BENCH_VENV) $(BENCH_DEPS)
	$(BENCH_FROM) $(BENCH_BIN)/python -m benchmarks

bench-venv: $(STAMP)
	@if [ "$$(cat .venv-bench/.python 2>/dev/null)" != "$(BENCH_PYTHON)" ] \
		|| [ pyproject.toml -nt .venv-bench/.python ]; then \
		$(BENCH_PYTHON) -m venv --clear --without-pip .venv-bench \
		&& $(BIN)/python -m pip --python .venv-bench/bin/python install -q -e '.[dev,demo]' \
		&& echo '$(BENCH_PYTHON)' > .venv-bench/.python; fi

bench-compiled: $(STAMP) $(BENCH_VENV)
	bash scripts/compiled_tree.sh $(BENCH_TREE) $(BENCH_BIN)/python

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
