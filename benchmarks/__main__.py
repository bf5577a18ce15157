"""Run the ``main()`` of every ``benchmarks/*_bench.py`` module, in name order."""

from __future__ import annotations

import importlib
import pkgutil
import platform
import sys

import benchmarks


def main() -> int:
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(benchmarks.__path__)
        if info.name.endswith("_bench")
    )
    print(f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})")
    for name in names:
        print(f"== {name}")
        module = importlib.import_module(f"benchmarks.{name}")
        module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
