"""`sidecar serve` as a process: bad settings fail fast by name; SIGTERM drains, exits 0; the
start-up heap is frozen out of the garbage collector's reach."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from emulator.app import build_app
from emulator.config import EmulatorConfig
from sidecar.entry.serve_command import YOUNG_THRESHOLD, tune_collector
from tests.servers import BASE_ENV, serve_app, until


def serve(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        pytest.param("SIDECAR_PORT", "eighty", id="port-not-a-number"),
        pytest.param("SIDECAR_SAFETY_FACTOR", "1.5", id="alpha-above-one"),
        pytest.param("SIDECAR_VRAM_TOTAL", "lots", id="size-unparseable"),
        pytest.param("SIDECAR_REJECT_MODE", "smoke", id="unknown-mode"),
        pytest.param("SIDECAR_MAX_WAIT_MS", "-1", id="negative-wait"),
        pytest.param("SIDECAR_PROT", "8080", id="typo-in-name"),
        pytest.param("SIDECAR_EVENT_LOOP", "tokio", id="unknown-event-loop"),
        pytest.param("SIDECAR_TOKENIZE_TIMEOUT_MS", "0", id="tokenize-deadline-zero"),
        pytest.param("SIDECAR_TOKENIZE_PER_CLIENT", "many", id="tokenize-share-unparseable"),
        pytest.param("SIDECAR_OVERLOAD_MEMORY", "half", id="overload-memory-unparseable"),
        pytest.param("SIDECAR_OVERLOAD_LOOP_LAG_MS", "-5", id="overload-lag-negative"),
    ],
)
def test_bad_setting_fails_fast_naming_it(setting: str, value: str) -> None:
    """A bad setting stops start-up with exit 2 and one line naming it, never a traceback."""
    process = serve({**BASE_ENV, setting: value})
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert setting in stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


@pytest.fixture
async def slow_engine() -> AsyncIterator[str]:
    """An emulated engine at 20 tokens/s, so a stream is still running when SIGTERM arrives."""
    runner, url = await serve_app(
        build_app(EmulatorConfig(model_name="tiny-llama", tokens_per_s=20))
    )
    yield url
    await runner.cleanup()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_sigterm_drains_in_flight_streams_then_exits_zero(
    slow_engine: str, loop: str, held_port: Callable[[], int]
) -> None:
    """On SIGTERM readiness fails at once, new requests get 503, the running stream finishes;
    on either event loop, which the start-up line names."""
    proxy, admin = held_port(), held_port()
    env = {
        **BASE_ENV,
        "SIDECAR_UPSTREAM_URL": slow_engine,
        "SIDECAR_PORT": str(proxy),
        "SIDECAR_ADMIN_PORT": str(admin),
        "SIDECAR_DRAIN_GRACE_S": "20",
        "SIDECAR_EVENT_LOOP": loop,
    }
    process = serve(env)
    try:
        async with aiohttp.ClientSession() as session:
            assert await until(
                lambda: _status(session, f"http://127.0.0.1:{admin}/readyz", 200), 20
            )
            body = {"model": "tiny-llama", "prompt": "hi", "max_tokens": 10, "stream": True}
            async with session.post(
                f"http://127.0.0.1:{proxy}/v1/completions", json=body
            ) as stream:
                first = await stream.content.readuntil(b"\n\n")
                process.send_signal(signal.SIGTERM)
                assert await until(
                    lambda: _status(session, f"http://127.0.0.1:{admin}/readyz", 503)
                )
                async with session.post(
                    f"http://127.0.0.1:{proxy}/v1/completions", json={**body, "stream": False}
                ) as refused:
                    assert refused.status == 503
                rest = await stream.read()
        assert first.startswith(b"data: ")
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert await asyncio.to_thread(process.wait, 20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        out, err = process.communicate()
    lines = (out + err).splitlines()
    listening = [json.loads(line) for line in lines if "sidecar_listening" in line]
    assert [line["event_loop"] for line in listening] == [loop]


async def _status(session: aiohttp.ClientSession, url: str, expected: int) -> bool:
    try:
        async with session.get(url) as response:
            return response.status == expected
    except aiohttp.ClientError:
        return False


def _one_line_exit_2(env: dict[str, str], *names: str) -> None:
    process = serve(env)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    for name in names:
        assert name in stderr


URL = "SIDECAR_UPSTREAM_URL"
START_UP_FAULTS = [
    pytest.param({URL: "localhost:8000"}, [URL], id="no-scheme"),
    pytest.param({URL: "http://"}, [URL], id="no-host"),
    pytest.param(
        {"SIDECAR_PORT": "9191", "SIDECAR_ADMIN_PORT": "9191"},
        ["SIDECAR_PORT", "SIDECAR_ADMIN_PORT"],
        id="port-clash",
    ),
    pytest.param({"SIDECAR_HOST": "no-such-host.invalid"}, ["SIDECAR_HOST"], id="bad-host"),
    pytest.param(
        {"SIDECAR_MAX_CONNECTIONS": "100000000"}, ["SIDECAR_MAX_CONNECTIONS"], id="cap-over-rlimit"
    ),
]


@pytest.mark.parametrize(("overrides", "names"), START_UP_FAULTS)
def test_start_up_faults_are_one_line_and_exit_2(
    overrides: dict[str, str], names: list[str]
) -> None:
    """A bad URL, a port clash, an unresolvable host, a cap the descriptors cannot hold."""
    _one_line_exit_2({**BASE_ENV, **overrides}, *names)


def test_a_port_in_use_is_one_line_naming_it() -> None:
    """Another process holds SIDECAR_PORT: one line naming it, exit 2, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        _one_line_exit_2({**BASE_ENV, "SIDECAR_PORT": port}, "SIDECAR_PORT", port)


async def test_drain_ends_within_grace_whatever_a_never_reading_client_does(
    slow_engine: str, held_port: Callable[[], int]
) -> None:
    """SIGTERM with 1 s grace and a stalled stream to a client that never reads: exit 0 in 3 s."""
    proxy, admin = held_port(), held_port()
    env = {
        **BASE_ENV,
        "SIDECAR_UPSTREAM_URL": slow_engine,
        "SIDECAR_PORT": str(proxy),
        "SIDECAR_ADMIN_PORT": str(admin),
        "SIDECAR_DRAIN_GRACE_S": "1",
    }
    process = serve(env)
    body = json.dumps({"model": "tiny-llama", "prompt": "hi", "max_tokens": 20, "stream": True})
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nx-emulator-fault: stall-after=1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    try:
        async with aiohttp.ClientSession() as session:
            ready = f"http://127.0.0.1:{admin}/readyz"
            assert await until(lambda: _status(session, ready, 200), 20)
            _reader, writer = await asyncio.open_connection("127.0.0.1", proxy)
            writer.write(request)
            assert await until(lambda: _in_use(session, admin, 1), 5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 10) == 0
        assert loop.time() - started < 1 + 2
        writer.close()
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()


async def _in_use(session: aiohttp.ClientSession, admin: int, n: int) -> bool:
    async with session.get(f"http://127.0.0.1:{admin}/capacity") as response:
        return bool((await response.json())["in_use"] == n)


def test_the_startup_heap_leaves_the_collectors_reach() -> None:
    """What is alive once serving starts is frozen (a full collection no longer walks it), and
    young collections come less often."""
    tracked, threshold = len(gc.get_objects()), gc.get_threshold()
    tune_collector()
    try:
        assert gc.get_freeze_count() >= tracked // 2
        assert len(gc.get_objects()) < tracked // 10
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


PASSWORD = "s3cret-pw-0123"
TOKEN = "tok-9876543210"


async def test_no_secret_of_the_engine_url_reaches_any_log_line(
    held_port: Callable[[], int],
) -> None:
    """An engine URL with ``user:password@`` and a key in its query: neither the start-up line
    nor the failing probe's lines print them, while they still name the host."""
    proxy, admin, dead = held_port(), held_port(), held_port()
    env = {
        **BASE_ENV,
        "SIDECAR_UPSTREAM_URL": f"http://admin:{PASSWORD}@127.0.0.1:{dead}",
        "SIDECAR_ENGINE_METRICS_URL": f"http://u:{PASSWORD}@127.0.0.1:{dead}/metrics?token={TOKEN}",
        "SIDECAR_CAPACITY_SOURCE": "vllm",
        "SIDECAR_REFRESH_MS": "100",
        "SIDECAR_PORT": str(proxy),
        "SIDECAR_ADMIN_PORT": str(admin),
        "SIDECAR_DRAIN_GRACE_S": "0",
    }
    process = serve(env)
    try:
        async with aiohttp.ClientSession() as session:
            assert await until(
                lambda: _status(session, f"http://127.0.0.1:{admin}/healthz", 200), 20
            )
            async with session.get(f"http://127.0.0.1:{admin}/capacity") as capacity:
                shown = await capacity.text()
        process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(process.wait, 20)
    finally:
        if process.poll() is None:
            process.kill()
        out, err = process.communicate()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    listening = [e for e in events if e["event"] == "sidecar_listening"]
    assert [e["upstream"] for e in listening] == [f"http://[redacted]@127.0.0.1:{dead}"]
    assert any(f"127.0.0.1:{dead}" in json.dumps(e) for e in events if e is not listening[0])
    for text in (out, err, shown):
        assert PASSWORD not in text
        assert TOKEN not in text


def test_a_bad_url_setting_is_named_without_its_password() -> None:
    """Start-up refuses a URL it cannot use in one line that quotes it, its password redacted."""
    process = serve({**BASE_ENV, URL: f"ftp://admin:{PASSWORD}@engine:21"})
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert URL in stderr
    assert "ftp://[redacted]@engine:21" in stderr
    assert PASSWORD not in stderr
