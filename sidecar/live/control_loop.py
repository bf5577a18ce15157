"""The capacity control loop: every SIDECAR_REFRESH_MS read the probes, plan, resize the bulkhead.

A failed read keeps the last good plan, marked stale; stale for longer than SIDECAR_STALE_AFTER_MS
falls back to a conservative floor. Each transition is logged once. The loop is a named task that
logs and survives anything a tick throws, so it cannot die silently.

The loop does not vouch for itself: ``state`` is judged when it is read, from the age of the last
good plan, so a loop that hangs (a probe read past its timeout, a stuck NVML call) or crashes
shows stale, then the floor, without another tick; a watchdog task applies that floor to the
bulkhead. Every probe read runs under SIDECAR_PROBE_TIMEOUT_MS, and any exception in a tick
degrades the plan like a failed probe. ``hurry()`` brings the next tick at once (but no sooner
than HURRY_GAP_S after the last): the SLO law's slow start steps while a burst waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import structlog

from sidecar.core.admission.modes import AdmissionMode
from sidecar.core.errors import PlanError, ProbeError, ProbeTemporaryError
from sidecar.core.limits import Limits
from sidecar.core.plan.capacity import Budget, KvCost, Plan, engine_cost, make_plan
from sidecar.core.plan.token_budget import TokenBudget
from sidecar.core.warnings import CLEARED_EVENT, RAISED_EVENT, ConfigWarning, changes, no_capacity
from sidecar.live.engine_health import EngineHealth
from sidecar.live.headroom import Headroom
from sidecar.live.probes import EngineProbe, EngineReading, GpuProbe, GpuSnapshot
from sidecar.live.probes.static import Declared
from sidecar.live.sources import Disagreement, Readings, plan_inputs

log = structlog.get_logger("sidecar.live.control_loop")

TASK_NAME = "capacity-control-loop"
WATCHDOG_NAME = "capacity-watchdog"
# The least time between two ticks, however often ``hurry()`` asks: a tick reads every probe.
HURRY_GAP_S = 0.25


@dataclass(frozen=True, kw_only=True)
class CapacityState:
    """The plan in force and how much to trust it; ``planned_at`` is when it was last good."""

    plan: Plan | None
    source: str
    limit: int
    in_flight: int | None = None  # the mode's cap on requests in flight beside the limit
    stale: bool = False
    on_floor: bool = False
    planned_at: float | None = None
    readings: Readings | None = None
    disagreements: tuple[Disagreement, ...] = ()
    error: str | None = None
    warnings: tuple[ConfigWarning, ...] = ()
    headroom: tuple[Headroom, ...] = ()  # per GPU; neighbours threaten this, not the pool

    @property
    def limits(self) -> Limits:
        """What the bulkhead enforces while this state is in force."""
        return Limits(limit=self.limit, in_flight=self.in_flight)

    @property
    def available(self) -> bool:
        """False while the plan cannot hold one request (requests are refused at once)."""
        return not any(w.code == "no_capacity" for w in self.warnings)

    @property
    def mode(self) -> str:
        """fresh, stale or floor: what readiness and the transition log report."""
        return "floor" if self.on_floor else "stale" if self.stale else "fresh"

    def age_s(self, now: float) -> float | None:
        """Seconds since the plan was last good (None before the first good plan)."""
        return None if self.planned_at is None else max(0.0, now - self.planned_at)


@dataclass(frozen=True)
class Floor:
    """What the sidecar falls back to when it cannot see: the static plan, or a fixed limit; and
    the cap on requests in flight until a plan says one (the static plan's, where the mode has
    one)."""

    plan: Plan | None
    limit: int
    in_flight: int | None = None


def judged(
    state: CapacityState, now: float, fresh_for_s: float, stale_after_s: float, floor: Floor
) -> CapacityState:
    """``state`` as it stands at ``now``: a plan not renewed in time is stale, then the floor."""
    age = state.age_s(now)
    if age is None or state.on_floor or age <= fresh_for_s:
        return state
    overdue = replace(state, error=state.error or f"no new plan for {age:.1f}s")
    return degrade(overdue, now, stale_after_s, floor)


def degrade(state: CapacityState, now: float, stale_after_s: float, floor: Floor) -> CapacityState:
    """The state after a failed tick: stale while the last good plan is young, then the floor."""
    age = state.age_s(now)
    if age is not None and age <= stale_after_s and not state.on_floor:
        return replace(state, stale=True)
    return replace(state, plan=floor.plan, limit=floor.limit, stale=True, on_floor=True)


@dataclass(frozen=True, kw_only=True)
class Sources:
    """What each tick reads: the capacity source asked for (auto, nvml, an engine's name,
    static), what the operator declared, the probes (None: not read), and the engine's
    process and how far its pool may disagree with NVML's before it is reported."""

    requested: str
    declared: Declared
    gpu_probe: GpuProbe | None = None
    engine_probe: EngineProbe | None = None
    engine_pid: int | None = None
    tolerance: float = 0.10


@dataclass(frozen=True, kw_only=True)
class Planning:
    """How a reading becomes limits: the model's price of a token (None: the engine's), the
    token budget and the safety factor of the plan, the admission mode whose limits each plan
    gives, and the floor. ``budget_rule``: the token budget for the engine's max_model_len
    (None: not known); without it, ``budget`` stands."""

    cost: KvCost | None
    budget: Budget
    alpha: float
    mode: AdmissionMode
    floor: Floor
    budget_rule: Callable[[int | None], TokenBudget] | None = None


@dataclass(frozen=True, kw_only=True)
class Cadence:
    """When the loop ticks and how long a plan stands: the period, the age past which a stale
    plan gives way to the floor, each probe read's deadline, the clock and the sleep.
    ``hurry_while``: asked after each tick; True makes the next one come HURRY_GAP_S later
    instead of a period later (``CapacityController.hurry``)."""

    refresh_s: float = 1.0
    stale_after_s: float = 10.0
    probe_timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    hurry_while: Callable[[], bool] = lambda: False


@dataclass(frozen=True, kw_only=True)
class Sinks:
    """Who hears the loop: the bulkhead, handed the limits whenever they change (``resize``)
    and told each tick ended, whether they changed or not (``ticked``: it judges its waiters
    against what the law's step learnt); whoever hears when a plan of 0 permits starts or
    stops (``available``); and what hears each tick's readings, its warnings joining the
    plan's (``feedback``)."""

    resize: Callable[[Limits], None]
    available: Callable[[bool], None] | None = None
    feedback: Callable[[Readings], tuple[ConfigWarning, ...]] | None = None
    ticked: Callable[[], None] | None = None


class CapacityController:
    """Owns the plan: ``refresh()`` is one tick; ``start()``/``stop()`` run it every refresh."""

    def __init__(
        self,
        *,
        sources: Sources,
        planning: Planning,
        sinks: Sinks,
        cadence: Cadence | None = None,
    ) -> None:
        """Reads ``sources``, plans by ``planning``, tells ``sinks``, ticks by ``cadence``."""
        self._sources, self._planning, self._sinks = sources, planning, sinks
        self._cadence = cadence = cadence or Cadence()
        self._clock = cadence.clock
        floor = planning.floor
        self._state = CapacityState(
            plan=None, source="none", limit=floor.limit, in_flight=floor.in_flight, on_floor=True
        )
        self._engine = EngineHealth()
        budget_rule, budget = planning.budget_rule, planning.budget
        self.token_budget: TokenBudget = (
            budget_rule(None)
            if budget_rule is not None
            else TokenBudget(
                prompt_tokens=budget.prompt_tokens,
                completion_tokens=budget.completion_tokens,
                context_tokens=None,
                prompt_origin="setting",
                completion_origin="setting",
            )
        )
        self._resized_to: Limits | None = None  # the limits last pushed to the bulkhead
        self._published = False
        self._task: asyncio.Task[None] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._hurried = asyncio.Event()

    @property
    def state(self) -> CapacityState:
        """The state in force now, judged by the age of the last good plan at this moment."""
        now = self._clock()
        stale_after_s = self._cadence.stale_after_s
        return judged(self._state, now, self.fresh_for_s, stale_after_s, self.floor)

    @property
    def floor(self) -> Floor:
        """What applies when the sidecar cannot read the GPU or the engine: the floor, or the
        limit the mode holds where that is higher (slo: the law's, steered by the streams)."""
        floor = self._planning.floor
        held = self._planning.mode.held_limit()
        if held is None or held <= floor.limit:
            return floor
        return replace(floor, limit=held)

    @property
    def fresh_for_s(self) -> float:
        """A plan older than this is stale: two missed ticks plus one probe timeout."""
        return 2 * self._cadence.refresh_s + self._cadence.probe_timeout_s

    @property
    def requested_source(self) -> str:
        """The capacity source the operator asked for (auto, nvml, an engine's name, static)."""
        return self._sources.requested

    @property
    def cost(self) -> KvCost:
        """What one token and one request cost in KV bytes (token-mode admission prices with it),
        as the plan in force counts it (the engine's block size included)."""
        plan = self._state.plan
        if plan is not None:
            return plan.cost
        return self._planning.cost or engine_cost(1, None)  # no plan, no model: one unit per token

    @property
    def pool_tokens(self) -> int | None:
        """The KV pool of the plan in force, in tokens (None: no plan to say it)."""
        plan = self._state.plan
        return None if plan is None else plan.kv_pool_tokens

    def running(self) -> bool:
        """True while the loop's task is alive (liveness reports a dead loop)."""
        return self._task is not None and not self._task.done()

    async def refresh(self) -> CapacityState:
        """One tick: read, plan, resize, publish. Never raises for a probe or plan failure."""
        readings = await self._read()
        now = self._clock()
        self._engine.observe(readings, now)
        cost = self._cost_for(readings)
        sources, planning, feedback = self._sources, self._planning, self._sinks.feedback
        try:
            extra = feedback(readings) if feedback is not None else ()
            inputs = plan_inputs(
                sources.requested,
                readings,
                cost,
                engine_pid=sources.engine_pid,
                tolerance=sources.tolerance,
            )
            plan = make_plan(inputs.cost, inputs.memory, self._plan_budget(), planning.alpha)
        except Exception as exc:  # a probe, a plan, or a bug: all of them degrade, none is fresh
            failed = degrade(self._state, now, self._cadence.stale_after_s, self.floor)
            detail = str(exc) if isinstance(exc, ProbeError | PlanError) else repr(exc)
            new = replace(failed, readings=readings, error=detail)
        else:
            limits = self._limits(plan, readings)
            new = CapacityState(
                plan=plan,
                source=inputs.source,
                limit=limits.limit,
                in_flight=limits.in_flight,
                planned_at=now,
                readings=readings,
                disagreements=inputs.disagreements,
                headroom=inputs.headroom,
                warnings=inputs.warnings + self._empty(plan) + extra,
            )
        self._publish(new)
        return new

    def _limits(self, plan: Plan, readings: Readings) -> Limits:
        """The mode's limits for ``plan``, told the engine's fixed slots (llama.cpp's -np) where
        this tick read them: a request past them would only wait at the engine, outside the
        sidecar's queue."""
        slots = readings.engine.slots if readings.engine is not None else None
        return self._planning.mode.step(plan, slots)

    def engine_unready(self) -> str | None:
        """Why the engine cannot serve, judged now from the age of its last good reading (a loop
        that hangs goes unready by itself); None while it answers, or where nothing probes it."""
        if self._sources.engine_probe is None:
            return None
        return self._engine.unready(self._clock(), self.fresh_for_s)

    def engine_silence_s(self) -> float | None:
        """Seconds since the engine last answered its probe; None where nothing probes it, or
        before it first answered."""
        seen = self._engine.seen_at
        if self._sources.engine_probe is None or seen is None:
            return None
        return max(0.0, self._clock() - seen)

    def _plan_budget(self) -> Budget:
        """The budget of this tick: the engine's context, narrowed by the settings."""
        rule = self._planning.budget_rule
        if rule is None:
            return self._planning.budget
        self.token_budget = rule(self._engine.max_model_len)
        return self.token_budget.plan_budget()

    def _empty(self, plan: Plan) -> tuple[ConfigWarning, ...]:
        """A no_capacity warning, with its arithmetic, when not one request fits."""
        if plan.permits > 0:
            return ()
        return (no_capacity(plan.kv_pool_tokens, plan.request_max_tokens, plan.alpha),)

    def _cost_for(self, readings: Readings) -> KvCost | None:
        """SIDECAR_BLOCK_SIZE when declared, else the block size the engine pages its cache in."""
        cache = readings.engine.cache if readings.engine is not None else None
        cost = self._planning.cost
        if cost is None or cost.block_size is not None or cache is None or cache.block_size is None:
            return cost
        return replace(cost, block_size=cache.block_size)

    def start(self) -> None:
        """Run ``refresh()`` every SIDECAR_REFRESH_MS, and the watchdog, in named, guarded tasks."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=TASK_NAME)
            self._task.add_done_callback(_report_exit)
            self._watchdog = asyncio.create_task(self._watch(), name=WATCHDOG_NAME)
            self._watchdog.add_done_callback(_report_exit)

    async def stop(self) -> None:
        """Cancel the loop and the watchdog, wait for them, and close the probes."""
        tasks = [t for t in (self._task, self._watchdog) if t is not None]
        self._task = self._watchdog = None
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for probe in (self._sources.gpu_probe, self._sources.engine_probe):
            if probe is not None:
                with contextlib.suppress(ProbeError):
                    await probe.close()

    def enforce(self) -> CapacityState:
        """Hand the bulkhead the limit of the state as judged now (the floor once it is stale)."""
        state = self.state
        if state.mode != self._state.mode:
            self._publish(state)
        return state

    async def _watch(self) -> None:
        while True:
            await self._cadence.sleep(self._cadence.refresh_s)
            self.enforce()

    def hurry(self) -> None:
        """Tick now rather than at the end of the period (HURRY_GAP_S after the last tick at the
        soonest): the limit refused or queued a burst while its law may still grow fast."""
        self._hurried.set()

    async def _run(self) -> None:
        while True:
            await self._next_tick()
            self._hurried.clear()  # a hurry during the tick asks for the one after it
            try:
                await self.refresh()
                if self._cadence.hurry_while():
                    self.hurry()
            except Exception:  # the loop must outlive any bug in one tick
                log.exception("capacity_tick_crashed")

    async def _next_tick(self) -> None:
        """Until the period ends, or ``hurry()`` was called, whichever is first, but never less
        than HURRY_GAP_S after the last tick."""
        sleep, refresh_s = self._cadence.sleep, self._cadence.refresh_s
        gap = min(HURRY_GAP_S, refresh_s)
        await sleep(gap)
        period = asyncio.ensure_future(sleep(refresh_s - gap))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait((period, hurried), return_when=asyncio.FIRST_COMPLETED)
        finally:
            period.cancel()
            hurried.cancel()

    async def _read(self) -> Readings:
        sources, timeout = self._sources, self._cadence.probe_timeout_s
        gpus, engine = await asyncio.gather(
            _attempt(sources.gpu_probe, timeout), _attempt(sources.engine_probe, timeout)
        )
        return Readings(
            declared=sources.declared,
            gpus=gpus[0] if isinstance(gpus[0], GpuSnapshot) else None,
            gpu_error=gpus[1],
            engine=engine[0] if isinstance(engine[0], EngineReading) else None,
            engine_error=engine[1],
        )

    def _publish(self, new: CapacityState) -> None:
        old, self._state = self._state, new
        # The one place the bulkhead's limits are set: pushed whenever they change.
        limits = new.limits
        if limits != self._resized_to:
            self._sinks.resize(limits)
            self._resized_to = limits
        elif self._sinks.ticked is not None:
            self._sinks.ticked()
        if (old.mode, old.source) != (new.mode, new.source) or not self._published:
            _log_transition(old, new)
        self._published = True
        available = self._sinks.available
        if old.available != new.available and available is not None:
            available(new.available)
        _log_warnings(old, new)
        if _flagged(old) != _flagged(new):
            log.warning("capacity_disagreement", gpus=sorted(_flagged(new)), checks=_checks(new))


async def _attempt(
    probe: GpuProbe | EngineProbe | None, timeout_s: float
) -> tuple[GpuSnapshot | EngineReading | None, ProbeError | None]:
    # The coroutine is made here, inside the task, so a cancelled tick leaves none un-awaited.
    if probe is None:
        return None, None
    try:
        async with asyncio.timeout(timeout_s):
            return await probe.read(), None
    except ProbeError as exc:
        return None, exc
    except TimeoutError:
        return None, ProbeTemporaryError(f"{type(probe).__name__} read timed out ({timeout_s}s)")
    except Exception as exc:  # a probe's bug reads as a failed probe, never as a fresh plan
        return None, ProbeTemporaryError(f"{type(probe).__name__} failed: {exc!r}")


def _log_transition(old: CapacityState, new: CapacityState) -> None:
    fields = {"source": new.source, "limit": new.limit, "previous": old.mode}
    if new.mode == "fresh":
        log.info("capacity_fresh", **fields)
    elif new.mode == "stale":
        log.warning("capacity_stale", error=new.error, **fields)
    else:
        log.error("capacity_on_floor", error=new.error, **fields)


def _flagged(state: CapacityState) -> set[str]:
    return {d.gpu for d in state.disagreements if d.beyond_tolerance}


def _checks(state: CapacityState) -> list[dict[str, object]]:
    return [
        {"gpu": d.gpu, "engine_bytes": d.engine_bytes, "nvml_bytes": d.nvml_bytes, "ratio": d.ratio}
        for d in state.disagreements
    ]


def _report_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("capacity_loop_died", error=repr(task.exception()))


def _log_warnings(old: CapacityState, new: CapacityState) -> None:
    raised, cleared = changes(old.warnings, new.warnings)
    for warning in raised:
        log.warning(RAISED_EVENT, code=warning.code, message=warning.message)
    for warning in cleared:
        log.info(CLEARED_EVENT, code=warning.code)
