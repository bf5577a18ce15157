"""Where a request's and a relayed event's instructions go, by C function: the two callgrind dumps
instructions_bench keeps (BENCH_INSTR_KEEP) for a target, split the way it splits its counts
(``stream = a + b x events``). The interpreter's own functions say how much is the bytecode loop,
frames, calls, attribute lookups and allocation; library functions say what their calls cost.

Run: ``python -m benchmarks.callgrind_split DIR [TARGET] [--inclusive] [--top N]`` after
``BENCH_INSTR_KEEP=DIR python -m benchmarks.instructions_bench`` (target ``sidecar`` by default;
the streams and events come from BENCH_INSTR_JSON, .bench/instructions.json). Needs valgrind's
``callgrind_annotate``. Exclusive costs by default: each function's own instructions, summing to
the total; ``--inclusive`` adds what each calls (then rows overlap).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

from benchmarks.instructions_bench import _summary

JSON_PATH = Path(os.environ.get("BENCH_INSTR_JSON", ".bench/instructions.json"))
_ROW = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(?:\*\s+)?(.+?)\s*$")
_NOISE = re.compile(r"/tmp/python-build[^ ]*/Python-[\d.]+/|\s\[[^]]*\]$")


def costs(dump: Path, *, inclusive: bool) -> dict[str, int]:
    """Instructions by ``file:function`` in one dump, as callgrind_annotate lists them."""
    # --auto=no: a compiled build's C sources lie beside the dump, and their annotated listing's
    # call lines ("=> file:function") would be counted as functions of their own.
    inclusive_flag = f"--inclusive={'yes' if inclusive else 'no'}"
    args = ["callgrind_annotate", "--threshold=100", "--auto=no", inclusive_flag]
    text = subprocess.run([*args, str(dump)], check=True, capture_output=True, text=True).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        if (match := _ROW.match(line)) and "PROGRAM TOTALS" not in line:
            name = _NOISE.sub("", match.group(2))
            found[name] = found.get(name, 0) + int(match.group(1).replace(",", ""))
    return found


def split(
    short: dict[str, int], long: dict[str, int], streams: int, events: tuple[int, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per request and per event, by function, from the two windows' costs."""
    few, many = events
    per_event = {k: (long.get(k, 0) - short.get(k, 0)) / streams / (many - few) for k in long}
    per_request = {k: short.get(k, 0) / streams - per_event.get(k, 0.0) * few for k in short}
    return per_request, per_event


def _print(title: str, rows: dict[str, float], total: float, top: int) -> None:
    print(f"{title}: {total:,.0f} instructions (idle time included)")
    for name, count in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {count:>9,.0f}  {count / total:6.1%}  {name[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("target", nargs="?", default="sidecar")
    parser.add_argument("--inclusive", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    bench = json.loads(JSON_PATH.read_text())
    (row,) = [r for r in bench["rows"] if r["target"] == args.target]
    streams, events = row["streams"], tuple(row["events"])  # relayed events, as a and b count
    names = [f"{args.target}.{n}ev.callgrind" for n in bench["meta"]["token_events"]]
    dumps = [args.dir / name for name in names]
    short, long = (costs(d, inclusive=args.inclusive) for d in dumps)
    per_request, per_event = split(short, long, streams, events)
    summaries = [{"total": _summary(dump) or 0} for dump in dumps]
    totals = split(summaries[0], summaries[1], streams, events)
    _print("per request", per_request, totals[0]["total"], args.top)
    _print("per event", per_event, totals[1]["total"], args.top)


if __name__ == "__main__":
    main()
