"""The ``sidecar`` command: ``plan``, ``serve`` and ``probe`` (the demo is ``python -m demo``).

Each sub-command lives in its own module exposing ``add_arguments(parser)`` and ``run(args)``;
this module only dispatches and turns a SidecarError into one clear line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

import sidecar
from sidecar.core.errors import SidecarError

DISTRIBUTION = "gpu-admission-sidecar"

COMMANDS = {
    "plan": ("sidecar.entry.plan_command", "work out how many concurrent requests a GPU can hold"),
    "serve": (
        "sidecar.entry.serve_command",
        "run the sidecar (configured from SIDECAR_* variables)",
    ),
    "probe": ("sidecar.entry.probe_command", "show what the sidecar sees now: GPUs, engine, plan"),
}


def version() -> str:
    """The installed distribution's version; the package's own when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return sidecar.__version__


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the help to read, not the usage block then the error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sidecar",
        description="GPU-aware admission controller for LLM inference servers "
        "(the demo is `python -m demo`).",
        epilog="`sidecar COMMAND --help` shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module = importlib.import_module(module_name)
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


NEGATIVE = frozenset({f"-{digit}" for digit in "0123456789."})


def glue_negative_values(argv: Sequence[str]) -> list[str]:
    """``--vram -5GiB`` -> ``--vram=-5GiB``: argparse reads a token that starts with ``-`` and is
    not a plain number as an option, and would answer "expected one argument" instead of
    saying what is wrong with the value. No option of ours takes a value that starts with ``-``
    otherwise, and no flag is followed by a positional argument."""
    glued: list[str] = []
    for token in argv:
        if glued and glued[-1].startswith("--") and "=" not in glued[-1] and token[:2] in NEGATIVE:
            glued[-1] = f"{glued[-1]}={token}"
        else:
            glued.append(token)
    return glued


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(glue_negative_values(sys.argv[1:] if argv is None else argv))
    if args.command is None:  # bare `sidecar`: show what it can do, as a usage error
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = args._run(args)
    except SidecarError as exc:
        print(f"sidecar {args.command}: error: {exc}", file=sys.stderr)  # noqa: T201
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`sidecar plan --json | head`): say nothing more, as cat would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
