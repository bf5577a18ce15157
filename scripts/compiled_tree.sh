#!/usr/bin/env bash
# A copy of the checkout with its request path compiled in place (setup.py, SIDECAR_COMPILE=1), for
# `make test-compiled` and `make bench BENCH_COMPILED=1`. A copy, because extension modules built
# into the working tree would shadow its sources: an edit would not run until the next build.
# Usage: scripts/compiled_tree.sh DEST PYTHON (an interpreter with mypy, and gcc on the PATH).
set -euo pipefail
dest=$1 python=$2
mkdir -p "$dest"
# Everything but mypyc's build folder, which keeps its C between runs, goes; then the tree's files
# (tracked, and untracked ones git does not ignore) are copied afresh.
find "$dest" -mindepth 1 -maxdepth 1 ! -name build -exec rm -rf {} +
git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - | tar -xf - -C "$dest"
cd "$dest"
SIDECAR_COMPILE=1 "$python" setup.py -q build_ext --inplace > build.log 2>&1 \
    || { cat build.log; echo "compiled_tree: the build failed (log above)" >&2; exit 1; }
echo "compiled_tree: $(find sidecar -name '*.so' | wc -l) extension modules in $dest"
