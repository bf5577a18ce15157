"""A request turned away after queueing reports what it really waited (bulkhead and proxy log)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from structlog.testing import capture_logs

from sidecar.core.errors import AdmissionRejectedError
from sidecar.entry.app import SidecarServer
from sidecar.entry.settings import load_settings
from sidecar.limiter.bulkhead import Bulkhead
from sidecar.limiter.events import AdmissionEvent
from tests.fake_time import FakeTime
from tests.servers import BASE_ENV, proxy_url, until
from tests.test_bulkhead import holder_and_waiter, make, new_log, settle
from tests.test_proxy_functional import CHAT, hold_stream


@pytest.mark.parametrize(
    ("advance_s", "reason", "waited_s"),
    [
        pytest.param(3.0, "timeout", 3.0, id="timed-out-after-max-wait"),
        pytest.param(1.25, "draining", 1.25, id="drained-while-queued"),
    ],
)
async def test_refused_waiter_carries_its_wait(
    advance_s: float, reason: str, waited_s: float
) -> None:
    """The error of a waiter refused from the queue says how long it waited there."""
    fake = FakeTime()
    bulkhead = make(fake, max_wait_s=3.0)
    gate = asyncio.Event()
    holder, waiter = await holder_and_waiter(bulkhead, gate, new_log())
    fake.advance(advance_s)
    if reason == "draining":
        bulkhead.drain()
    await settle()
    with pytest.raises(AdmissionRejectedError) as raised:
        await waiter
    assert raised.value.reason == reason
    assert raised.value.waited_s == pytest.approx(waited_s)
    gate.set()
    await holder


async def test_refused_at_once_waited_nothing() -> None:
    """A request turned away without queueing (queue full) reports a wait of zero."""
    bulkhead = make(FakeTime(), max_queue=0)
    gate = asyncio.Event()
    holder = asyncio.create_task(_hold(bulkhead, gate))
    await settle()
    with pytest.raises(AdmissionRejectedError) as raised:
        async with bulkhead.admit():
            pass
    assert (raised.value.reason, raised.value.waited_s) == ("queue_full", 0.0)
    gate.set()
    await holder


async def _hold(bulkhead: Bulkhead, gate: asyncio.Event) -> None:
    async with bulkhead.admit():
        await gate.wait()


class Clock:
    """The sidecar's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def sidecar_with_clock(engine: str) -> AsyncIterator[tuple[SidecarServer, Clock]]:
    """One permit, a queue of one, a wait long enough that only the test ends it."""
    clock = Clock()
    env = {
        **BASE_ENV,
        "SIDECAR_UPSTREAM_URL": engine,
        "SIDECAR_KV_POOL": "131072",
        "SIDECAR_MAX_QUEUE": "1",
        "SIDECAR_MAX_WAIT_MS": "600000",
    }
    server = SidecarServer(load_settings(env), clock=clock)
    await server.start()
    yield server, clock
    await server.stop()


async def test_proxy_logs_the_real_queue_wait_of_a_refused_request(
    sidecar_with_clock: tuple[SidecarServer, Clock],
) -> None:
    """A stream queued 2.5 s (sidecar clock) then refused logs queue_wait_s=2.5, not 0.0."""
    server, clock = sidecar_with_clock
    async with aiohttp.ClientSession() as session:
        held = await hold_stream(session, proxy_url(server))
        with capture_logs() as logs:
            waiting = asyncio.ensure_future(
                session.post(
                    f"{proxy_url(server)}/v1/chat/completions", json={**CHAT, "stream": True}
                )
            )
            assert await until(lambda: _queued(server))
            clock.now += 2.5
            server.bulkhead.drain()
            async with await waiting as response:
                await response.read()
        held.close()
    finished = [e for e in logs if e["event"] == "request_finished" and e["outcome"] == "draining"]
    rejected = [e for e in logs if e["event"] == "admission_rejected"]
    assert [e["queue_wait_s"] for e in finished] == [2.5]
    assert [e["queue_wait_s"] for e in rejected] == [2.5]


async def _queued(server: SidecarServer) -> bool:
    return server.bulkhead.snapshot().queued == 1


def test_the_wait_histogram_records_a_timed_out_wait_as_it_was() -> None:
    """sidecar_queue_wait_seconds gets a timed-out request's own wait, not the configured max."""
    server = SidecarServer(load_settings({**BASE_ENV, "SIDECAR_MAX_WAIT_MS": "3000"}))
    server._on_event(
        AdmissionEvent(
            kind="rejected",
            compartment="default",
            cost=1,
            shadow=False,
            queued=0,
            wait_s=3.2,
            reason="timeout",
        )
    )
    total = server.registry.get_sample_value("sidecar_queue_wait_seconds_sum")
    count = server.registry.get_sample_value("sidecar_queue_wait_seconds_count")
    assert total == pytest.approx(3.2)
    assert count == 1.0
