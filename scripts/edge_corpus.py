"""Write tests/fixtures/edge-corpus/requests.json: request vectors from other parsers' own test
corpora, for tests/test_edge_corpus_functional.py to replay against the sidecar.

Only the request bytes are taken (data, not code), from the source distributions named on the
command line (``pip download --no-deps --no-binary :all: aiohttp==3.14.5 h11==0.16.0``, then
unpacked):

- llhttp's Markdown request fixtures (the copy vendored in aiohttp's sdist, vendor/llhttp/test/
  request/*.md): every strict ``request`` case, its input decoded as llhttp's md-test.ts does;
- aiohttp's tests/test_http_parser.py and h11's h11/tests/*.py: every bytes literal that starts
  with a request line.

    python -m scripts.edge_corpus /tmp/aiohttp-3.14.5 /tmp/h11-0.16.0
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).parent.parent / "tests" / "fixtures" / "edge-corpus" / "requests.json"
LONGEST = 2048  # bytes: longer vectors test sizes the edge tests already cover
REQUEST_LINE = re.compile(rb"^\r?\n?[A-Za-z#]+ \S* ?HTTP/")
_MD_CASE = re.compile(
    r"^#+ (?P<title>[^\n]+)\n+<!-- meta=(?P<meta>\{[^\n]*\}) -->\n```http\n(?P<input>.*?)```",
    re.DOTALL | re.MULTILINE,
)


def llhttp_cases(root: Path) -> list[tuple[str, bytes]]:
    """Every strict request case of llhttp's Markdown fixtures, decoded like md-test.ts."""
    cases = []
    for md in sorted((root / "vendor" / "llhttp" / "test" / "request").glob("*.md")):
        for match in _MD_CASE.finditer(md.read_text()):
            meta = json.loads(match["meta"])
            if meta not in ({"type": "request"}, {"type": "request", "noScan": True}):
                continue  # lenient modes, pauses: not how the sidecar runs llhttp
            if "${" in match["input"]:
                continue  # inline JavaScript builds the input
            cases.append((f"{md.stem}: {match['title']}", _decode_md(match["input"])))
    return cases


def _decode_md(text: str) -> bytes:
    text = re.sub(r"\n\Z", "", text)
    text = re.sub(r"\\(\r\n|\r|\n)", "", text)
    text = re.sub(r"\r\n|\r|\n", "\r\n", text)
    for escape, char in (("\\r", "\r"), ("\\n", "\n"), ("\\t", "\t"), ("\\f", "\f")):
        text = text.replace(escape, char)
    text = re.sub(r"\\x([0-9a-fA-F]+)", lambda m: chr(int(m[1], 16)), text)
    text = re.sub(r"\\([0-7]{1,3})", lambda m: chr(int(m[1], 8)), text)
    return text.encode()  # md-test.ts hands the parser Buffer.from(input): UTF-8


def literal_cases(files: list[Path], prefix: str) -> list[tuple[str, bytes]]:
    """Every bytes literal in ``files`` that starts with a request line, named by its function."""
    cases = []
    for path in files:
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, bytes) and REQUEST_LINE.match(value):
                    cases.append((f"{prefix}{path.stem}::{function.name}", value))
    return cases


def main(aiohttp_root: Path, h11_root: Path) -> None:
    version = aiohttp_root.name.removeprefix("aiohttp-")
    llhttp = json.loads((aiohttp_root / "vendor" / "llhttp" / "package.json").read_text())
    sources = {
        f"llhttp {llhttp['version']} (aiohttp {version} sdist)": llhttp_cases(aiohttp_root),
        f"aiohttp {version}": literal_cases([aiohttp_root / "tests" / "test_http_parser.py"], ""),
        f"h11 {h11_root.name.removeprefix('h11-')}": literal_cases(
            sorted((h11_root / "h11" / "tests").glob("test_*.py")), ""
        ),
    }
    seen: set[bytes] = set()
    vectors = []
    for source, cases in sources.items():
        for name, raw in cases:
            if raw in seen or len(raw) > LONGEST:
                continue
            seen.add(raw)
            vectors.append({"source": source, "case": name, "raw": raw.decode("latin-1")})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = ",\n".join(json.dumps(vector) for vector in vectors)
    header = json.dumps({"sources": list(sources), "encoding": "latin-1"})[:-1]
    OUT.write_text(f'{header}, "vectors": [\n{lines}\n]}}\n')
    print(f"{len(vectors)} vectors -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
