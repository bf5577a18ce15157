"""The composition root: builds the bulkhead, the capacity loop, the proxy and admin apps from the
settings, starts them in order, drains and stops them in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable

import structlog
from prometheus_client import CollectorRegistry

from sidecar.core.admission.compartments import parse_compartments
from sidecar.core.outcomes import EDGE_FAULTS, EdgeFault
from sidecar.core.redaction import redact_url
from sidecar.core.request.claims import parse_claim_trust
from sidecar.edge.admin import Admin, admin_handler
from sidecar.edge.engine.pool import EnginePool
from sidecar.edge.http.limits import ConnectionCount, EdgeLimits
from sidecar.edge.http.server import HttpServer
from sidecar.edge.overload import OverloadManager, resident_bytes, start_watching
from sidecar.edge.proxy.handler import Proxy, ProxyConfig, proxy_handler
from sidecar.edge.proxy.in_flight import InFlight
from sidecar.edge.proxy.intake import BodyLimits, Gate
from sidecar.edge.proxy.routes import ProxyPaths, parse_forward_paths, parse_free_paths
from sidecar.entry.event_loop import running_loop_name
from sidecar.entry.listen import SHUTDOWN_TIMEOUT_S, bind, reserve_descriptors, serve
from sidecar.entry.logs import OncePer
from sidecar.entry.policy import SidecarPolicy
from sidecar.entry.settings import Settings
from sidecar.entry.wiring import (
    build_adaptive,
    build_bulkhead,
    build_controller,
    build_mode,
    build_slo,
    objectives_of_settings,
    overload_manager,
    prompt_counter,
    signal_config_of_settings,
)
from sidecar.limiter.events import AdmissionEvent
from sidecar.live.control_loop import CapacityController
from sidecar.live.probes import GpuProbe
from sidecar.live.sources import Readings
from sidecar.telemetry.adaptive_metrics import AdaptiveCollector
from sidecar.telemetry.capacity_metrics import register_capacity_metrics
from sidecar.telemetry.metrics import BulkheadCollector, RequestMetrics
from sidecar.telemetry.saturation_metrics import SaturationCollector, SaturationSignal
from sidecar.telemetry.slo_metrics import SloCollector

log = structlog.get_logger("sidecar")

# After the grace ran out and the streams were told to stop: how long their last words may take.
STOP_WAIT_S = 1.0


class SidecarServer:
    """Both ports of one sidecar, and everything behind them."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
        gpu_probe: GpuProbe | None = None,
        resident_bytes: Callable[[], int] = resident_bytes,
    ) -> None:
        self.settings, self.clock = settings, clock
        self._resident_bytes = resident_bytes  # the overload manager's monitor
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics = RequestMetrics(self.registry, objectives_of_settings(settings))
        # The mode's law hears whether the limit bound lately: the bulkhead, built for the mode.
        self.adaptive = build_adaptive(settings, self._pressed)
        self.slo = build_slo(settings, self._pressed, clock, self._demand, self._starting)
        compartments = parse_compartments(settings.compartments)
        self.mode = build_mode(
            settings, self.adaptive, compartments.resolve, lambda: self.controller.cost, self.slo
        )
        self.bulkhead = build_bulkhead(
            settings, self.mode, limit=0, clock=clock, on_event=self._on_event
        )
        self.signal = SaturationSignal(
            self.bulkhead.snapshot,
            self.metrics.requests,
            clock,
            objectives=objectives_of_settings(settings),
            oldest_wait_s=self.bulkhead.oldest_wait_s,
            config=signal_config_of_settings(settings),
            max_num_seqs=settings.engine_max_num_seqs,
        )
        self.controller: CapacityController = build_controller(
            settings,
            self.bulkhead.resize,
            self.mode,
            clock=clock,
            nvml=gpu_probe,
            adaptive=self.adaptive,
            available=self.bulkhead.set_available,
            observe=self._observe,
            slo=self.slo,
            hurry_while=self._growing_on_a_queue,
            ticked=self.bulkhead.judge_waiters,
        )
        self.upstream = EnginePool(
            settings.upstream_url,
            connect_timeout_s=settings.upstream_connect_timeout_ms / 1000,
            read_timeout_s=settings.upstream_read_timeout_ms / 1000,
            engine_silence=self.controller.engine_silence_s,
        )
        self.draining = False
        self.in_flight = InFlight()
        self.gate = Gate(settings.max_pre_admission, clock)
        self.proxy_connections: ConnectionCount | None = None
        self._door_log = OncePer(clock=clock)
        self.proxy_server: HttpServer | None = None
        self.overload: OverloadManager | None = None
        self._overload_task: asyncio.Task[None] | None = None
        self.admin_server: HttpServer | None = None
        self.proxy_port = self.admin_port = 0
        register_capacity_metrics(self.registry, self.controller, clock)
        self.registry.register(BulkheadCollector(self.bulkhead.snapshot, self._plan_permits))
        if self.adaptive is not None:
            self.registry.register(AdaptiveCollector(self.adaptive, self.bulkhead.snapshot))
        self.registry.register(SaturationCollector(self.signal))
        if self.slo is not None:
            self.registry.register(SloCollector(self.slo))

    def _observe(self, readings: Readings) -> None:
        """Each tick's readings: the scale-out signal, and how long the engine's requests run
        (the mean and its quantiles) and, under slo, how they fill its KV cache, for the
        Retry-After hint's pace and forecast."""
        self.signal.observe(readings)
        engine = readings.engine
        if engine is None:
            self.bulkhead.expect_hold(None)
        else:
            self.bulkhead.expect_hold(engine.typical_inference_s, engine.inference_quantiles_s)
        if self.slo is not None:
            self.bulkhead.expect_cache(self.slo.cache_growth(engine))

    def _pressed(self) -> bool:
        """Whether the limit bound since the law last asked (the bulkhead's ``pressed``)."""
        return self.bulkhead.pressed()

    def _demand(self) -> int:
        """Requests in flight and waiting for a permit now, and those refused for room since the
        last tick: on a fresh pod whose limit starts at one, the queue behind it is refused as
        hopeless before a tick sees it, and a slow start that reached only for what waits at the
        tick stayed at one (8 closed-loop users, 22 busy answers in 25 s, 7 of 14 within the
        objectives, where the engine alone serves all 8)."""
        snapshot = self.bulkhead.snapshot()
        return snapshot.in_use + snapshot.queued + self.bulkhead.turned_away()

    def _starting(self) -> int:
        """Streams starting (admitted, no first token yet) and requests waiting for a permit:
        under slo, a starting stream is what holds the bulkhead's limit."""
        snapshot = self.bulkhead.snapshot()
        return snapshot.in_use_cost + snapshot.queued

    def _refused_at_door(self, fault: EdgeFault) -> None:
        """A refusal or deadline at the proxy port's door: counted every time, logged once per
        burst (the first at once, then one line per interval with how many came since)."""
        self.metrics.refused(fault)
        self._log_refusal(fault)

    def _log_refusal(self, fault: EdgeFault) -> None:
        """An edge refusal's log line: the first at once, then one per interval per code with how
        many came since (a flood is a few lines, not one a connection)."""
        since = self._door_log.allow(fault)
        if since is not None:
            log.warning(EDGE_FAULTS[fault].log_event, port="proxy", repeated=since)

    def _plan_permits(self) -> int:
        plan = self.controller.state.plan
        return plan.permits if plan is not None else 0

    def _on_event(self, event: AdmissionEvent) -> None:
        """Bulkhead decisions -> metrics; the proxy logs them, in each request's own context."""
        kind = event.kind
        if kind == "granted":  # once a request: the rest is for refusals
            self.metrics.waited(event.wait_s)
        elif kind == "rejected":
            if event.reason == "timeout":
                self.metrics.waited(event.wait_s)  # what it really waited, timer slack included
            if event.shadow and event.reason is not None:
                self.metrics.shadow_rejected(event.reason)
        if kind == "queued" or event.reason in ("queue_full", "shed"):
            self._bound()

    def _bound(self) -> None:
        """The limit bound (a request queued or was refused for room): while the SLO law may
        still grow it fast, its next step comes now, not at the next tick, so that a burst on a
        fresh pod waits a fraction of a second for the limit instead of timing out or being
        refused."""
        if self._grows_fast():
            self.controller.hurry()

    def _grows_fast(self) -> bool:
        return self.mode.grows_fast(self.controller.state.limit)

    def _growing_on_a_queue(self) -> bool:
        """After a tick: requests still wait while the law may grow fast, so the next step
        comes at once too (until they are in, or the law's first cut ends its slow start)."""
        return self.bulkhead.snapshot().queued > 0 and self._grows_fast()

    def _proxy(self) -> Proxy:
        s = self.settings
        config = ProxyConfig(
            reject_mode=s.reject_mode,
            paths=ProxyPaths(
                free=parse_free_paths(s.free_paths), forwarded=parse_forward_paths(s.forward_paths)
            ),
            body=BodyLimits(s.body_timeout_ms / 1000, s.body_min_rate, s.body_rate_grace_ms / 1000),
            write_timeout_s=s.client_write_timeout_ms / 1000,
            stall_s=s.client_stall_ms / 1000,
        )
        policy = SidecarPolicy(
            s,
            self.mode,
            self.controller,
            self.metrics,
            signal=self.signal,
            log_refusal=self._log_refusal,
        )
        _warn_unclaimable(s)
        counter = prompt_counter(s, self.upstream)
        return Proxy(
            config=config,
            policy=policy,
            bulkhead=self.bulkhead,
            upstream=self.upstream,
            metrics=self.metrics,
            clock=self.clock,
            counter=counter,
            gate=self.gate,
            in_flight=self.in_flight,
        )

    def _edge_limits(
        self, max_connections: int, per_client: int, bodies: int, client_bodies: int
    ) -> EdgeLimits:
        s = self.settings
        return EdgeLimits(
            max_connections=max_connections,
            max_connections_per_client=per_client,
            max_partial_heads=min(s.max_partial_heads, max_connections),
            max_buffered_body_bytes=bodies,
            max_buffered_body_bytes_per_client=client_bodies,
            header_timeout_s=s.header_timeout_ms / 1000,
            keepalive_timeout_s=s.keepalive_timeout_ms / 1000,
        )

    def _admin(self) -> Admin:
        return Admin(
            bulkhead=self.bulkhead,
            controller=self.controller,
            registry=self.registry,
            clock=self.clock,
            draining=lambda: self.draining,
            loop_alive=self.controller.running,
            mode=self.mode,
            signal=self.signal,
        )

    async def start(self) -> None:
        """Bind both ports, plan once, start the loop, then serve admin and proxy."""
        s = self.settings
        reserve_descriptors(s.max_connections)
        admin_sock = bind(s.admin_host, s.admin_port, "ADMIN_")
        try:
            proxy_sock = bind(s.host, s.port, "")
        except BaseException:
            admin_sock.close()
            raise
        await self._start(admin_sock, proxy_sock)

    async def _start(self, admin_sock: socket.socket, proxy_sock: socket.socket) -> None:
        state = await self.controller.refresh()
        log.info("capacity_initial", source=state.source, limit=state.limit, mode=state.mode)
        self.controller.start()
        s = self.settings
        self.admin_server = await serve(
            admin_handler(self._admin()),
            admin_sock,
            self._edge_limits(64, 64, 64 * 1024, 64 * 1024),
            max_body_bytes=1024,
            clock=self.clock,
        )
        self.admin_port = int(admin_sock.getsockname()[1])  # the real port, also when 0 asked
        self.proxy_server = await serve(
            proxy_handler(self._proxy()),
            proxy_sock,
            self._edge_limits(
                s.max_connections,
                s.max_connections_per_client,
                int(s.max_buffered_body_bytes),
                int(s.max_buffered_body_bytes_per_client),
            ),
            max_body_bytes=int(s.max_body_bytes),
            refused=self._refused_at_door,
            clock=self.clock,
        )
        self.proxy_connections = self.proxy_server.count
        self.overload = overload_manager(s, self.proxy_server.connections)
        if self.overload is not None:
            self._overload_task = start_watching(self.overload, self._resident_bytes)
        self.proxy_port = int(proxy_sock.getsockname()[1])
        log.info(
            "sidecar_listening",
            proxy_port=self.proxy_port,
            admin_port=self.admin_port,
            upstream=redact_url(s.upstream_url),
            admission=s.admission,
            mode=self.mode.name,
            shadow=s.shadow,
            event_loop=running_loop_name(),
        )

    async def drain(self, grace_s: float) -> bool:
        """Fail readiness, refuse new work, let running streams finish; True if all finished.

        When the grace runs out, every request still running is ended (SSE streams in-band with
        ``draining``), so the drain takes at most ``grace_s`` plus a second, whatever clients do.
        """
        self.draining = True
        self.bulkhead.drain()
        log.info("drain_started", in_flight=self.bulkhead.snapshot().in_use, grace_s=grace_s)
        try:
            await asyncio.wait_for(self.bulkhead.idle(), grace_s)
        except TimeoutError:
            stopped = self.in_flight.stop_all("draining")
            log.warning(
                "drain_grace_expired", in_flight=self.bulkhead.snapshot().in_use, stopped=stopped
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.bulkhead.idle(), STOP_WAIT_S)
            return False
        log.info("drain_finished")
        return True

    async def stop(self) -> None:
        """Close the ports (proxy first), stop the loops, close the upstream client."""
        if self._overload_task is not None:
            self._overload_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._overload_task
            self._overload_task = None
        for server in (self.proxy_server, self.admin_server):
            if server is not None:
                await server.close(SHUTDOWN_TIMEOUT_S)
        self.proxy_server = self.admin_server = None
        await self.controller.stop()
        self.upstream.close()


def _warn_unclaimable(s: Settings) -> None:
    """Settings that act on claimed objectives, with nobody trusted to claim one: said once."""
    acting = [
        name
        for name, given in (
            ("SIDECAR_COMPARTMENT_BY=priority", s.compartment_by == "priority"),
            ("SIDECAR_SHEDDABLE", bool(s.sheddable)),
            ("SIDECAR_OBJECTIVE_PRIORITIES", bool(s.objective_priorities)),
        )
        if given
    ]
    if acting and not parse_claim_trust(s.claims_from).trusts_anyone:
        log.warning("claims_ignored", settings=acting, fix="SIDECAR_CLAIMS_FROM=<gateway CIDRs>")
