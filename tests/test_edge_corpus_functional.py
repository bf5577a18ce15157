"""Other parsers' request corpora replayed against the real sidecar.

tests/fixtures/edge-corpus/requests.json holds request vectors from llhttp's, aiohttp's and h11's
own test suites (scripts/edge_corpus.py names the versions and how they were taken). Each one is
sent as it is, and again with a Host field where it has none (so that the Host rule does not stop
it first), with a priced request pipelined behind it, as a smuggler would. Whatever the sidecar
answers, nothing may reach the engine without a permit, every permit comes back, and no answer
is a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.edge.proxy.routes import DEFAULT_FREE_PATHS, SAFE_METHODS, normalise_path
from sidecar.entry.app import SidecarServer
from tests.engine_double import EngineDouble, double
from tests.servers import sidecars, until

__all__ = ["double"]

Start = Callable[..., Awaitable[SidecarServer]]
CORPUS = Path(__file__).parent / "fixtures" / "edge-corpus" / "requests.json"
COMPLETION = b'{"model":"m","prompt":"hi","max_tokens":5}'
BEHIND = (
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(COMPLETION), COMPLETION)
)
STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3}) ")
AT_ONCE = 24  # connections replayed together: under the per-client cap, and kind to CI


def vectors() -> list[tuple[str, bytes]]:
    document = json.loads(CORPUS.read_text())
    return [
        (f"{v['source']}: {v['case']}", v["raw"].encode("latin-1")) for v in document["vectors"]
    ]


def with_host(raw: bytes) -> bytes:
    """``raw`` with a Host field after its request line, where its head has none."""
    line, sep, rest = raw.partition(b"\r\n")
    if not sep or re.search(rb"(?im)^host:", raw.partition(b"\r\n\r\n")[0]):
        return raw
    return line + b"\r\nHost: x\r\n" + rest


@pytest.fixture
async def edge(double: EngineDouble) -> AsyncIterator[Start]:
    """Start sidecars in front of the recording double; stopped at teardown."""
    async with sidecars(double.url) as start:
        yield start


async def replay(port: int, raw: bytes) -> list[int]:
    """Send ``raw`` and the priced request behind it; the statuses answered until the close."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw + BEHIND)
        async with asyncio.timeout(10):
            answer = await reader.read()
    except ConnectionResetError:
        answer = b""
    finally:
        writer.close()
    return [int(status) for status in STATUS_LINE.findall(answer)]


def needing_a_permit(seen: list[tuple[str, str]]) -> int:
    """What reached the engine that admission should have priced."""
    free = {normalise_path(p) for p in DEFAULT_FREE_PATHS}
    return sum(
        1
        for method, target in seen
        if method not in SAFE_METHODS and target.partition("?")[0] not in free
    )


async def test_no_corpus_vector_reaches_the_engine_without_a_permit(
    edge: Start, double: EngineDouble
) -> None:
    """Every vector of the corpus, as it is and with a Host, with a priced request behind it:
    the engine sees only what was admitted, permits and body bytes balance, no 500, every
    connection ends."""
    server = await edge(
        SIDECAR_HEADER_TIMEOUT_MS="300", SIDECAR_BODY_TIMEOUT_MS="300", SIDECAR_KV_POOL="1GiB"
    )
    cases = [
        (f"{name} [{kind}]", raw)
        for name, raw0 in vectors()
        for kind, raw in (("as sent", raw0), ("with Host", with_host(raw0)))
    ]
    assert len(cases) >= 400
    failures: dict[str, list[int]] = {}
    for start in range(0, len(cases), AT_ONCE):
        batch = cases[start : start + AT_ONCE]
        answers = await asyncio.gather(*(replay(server.proxy_port, raw) for _, raw in batch))
        failures.update(
            {
                name: st
                for (name, _), st in zip(batch, answers, strict=True)
                if any(s >= 500 and s != 503 for s in st)
            }
        )
    assert failures == {}
    snapshot = server.bulkhead.snapshot()
    # At most: a request admitted and forwarded may still be one the engine's parser refuses
    # (llhttp takes `ANNOUNCE /x RTSP/1.0` as a request; aiohttp's engine double does not).
    assert needing_a_permit(double.seen) <= snapshot.granted_total
    assert snapshot.in_use == 0
    assert await until(lambda: _no_connections(server))
    assert server.proxy_server is not None
    assert server.proxy_server.bodies.held == 0  # every body's bytes came back


async def _no_connections(server: SidecarServer) -> bool:
    return server.proxy_connections is not None and server.proxy_connections.open == 0


def test_the_corpus_is_the_one_its_script_names() -> None:
    """The vendored file says where each vector came from, and holds all three sources."""
    document = json.loads(CORPUS.read_text())
    sources = {vector["source"] for vector in document["vectors"]}
    assert sources == set(document["sources"])
    assert {s.split()[0] for s in sources} == {"llhttp", "aiohttp", "h11"}
