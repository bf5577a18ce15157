"""Configuration of `sidecar serve`, read from the environment (prefix ``SIDECAR_``).

Tests pass a plain dict to :func:`load_settings`; nothing reads ``os.environ`` behind their back:
the only source pydantic-settings is given is the mapping we hand it (empty values count as unset).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sidecar.core.admission.compartments import parse_compartments
from sidecar.core.admission.estimator import EstimatorConfig
from sidecar.core.admission.tenancy import parse_priorities
from sidecar.core.errors import ConfigError, RequestError
from sidecar.core.laws.overcommit import AimdConfig
from sidecar.core.laws.saturation import SaturationConfig
from sidecar.core.redaction import redact_url
from sidecar.core.request.claims import parse_claim_trust
from sidecar.core.request.objectives import Objectives
from sidecar.core.sizes import parse_size
from sidecar.edge.proxy.routes import parse_forward_paths
from sidecar.entry.event_loop import EventLoop

ENV_PREFIX = "SIDECAR_"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port (tests)


def _read_size(value: Any) -> Any:
    """Sizes in the environment are text; read them with the CLI's parser, so both agree."""
    if not isinstance(value, str):
        return value
    try:
        return parse_size(value)
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc


Size = Annotated[int, BeforeValidator(_read_size), Field(ge=0)]
"""Bytes, written as 24GiB, 24Gi, 24GB, 24G, 512MiB or 1073741824 (see sidecar.core.sizes)."""

# The control laws' defaults are the core's: a setting's default is read from them, not repeated.
_OBJECTIVES, _ESTIMATOR, _AIMD = Objectives(), EstimatorConfig(), AimdConfig()
_SIGNAL = SaturationConfig()

# Where each group of settings starts, in declaration order (`sidecar serve --help`, the docs).
# A setting belongs to the group of the nearest start above it.
GROUP_STARTS = {
    "upstream_url": "network",
    "capacity_source": "capacity",
    "admission": "admission",
    "utilisation_window_s": "scale-out signal",
    "log_level": "logs",
}


class Settings(BaseSettings):
    """Every ``SIDECAR_*`` setting, with its default."""

    # allow_inf_nan=False: "nan" or "inf" for a factor, a timeout or a share is refused as such.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, allow_inf_nan=False
    )

    # --- network -------------------------------------------------------------------------------
    upstream_url: str = Field(
        "http://127.0.0.1:8000",
        description="the engine's base URL (vLLM or any OpenAI-compatible server)",
    )
    host: str = Field("0.0.0.0", description="address the proxy listens on")  # noqa: S104
    port: Port = Field(8080, description="proxy port clients connect to (0: any free port)")
    admin_host: str = Field(
        "0.0.0.0",  # noqa: S104
        description="address the admin listener (/capacity, /metrics, /healthz, /readyz) binds",
    )
    admin_port: Port = Field(9090, description="admin port (0: any free port)")
    upstream_connect_timeout_ms: PositiveInt = Field(
        2000, description="longest wait to connect to the engine"
    )
    upstream_read_timeout_ms: PositiveInt = Field(
        60_000,
        description="longest silence from the engine (between chunks, or before an answer; "
        "before its first byte, the engine answering its metrics probe is not silence, so a long "
        "non-streaming answer is not cut for its length)",
    )
    max_body_bytes: Size = Field(
        4 * 1024 * 1024, description="largest request body (a size); larger bodies get 413"
    )
    max_buffered_body_bytes: Size = Field(
        128 * 1024 * 1024,
        description="request body bytes held at once on the proxy port, all connections "
        "together (a size); a body that does not fit gets 503 body_budget_full",
    )
    max_buffered_body_bytes_per_client: Size = Field(
        32 * 1024 * 1024,
        description="request body bytes one client address may hold at once on the proxy port "
        "(a size); more gets 503 client_body_budget_full. Behind a gateway, whose address every "
        "request shares, raise it to SIDECAR_MAX_BUFFERED_BODY_BYTES",
    )
    drain_grace_s: Annotated[float, Field(ge=0)] = Field(
        30.0,
        description="after SIGTERM, how long running streams may finish before the sidecar stops",
    )
    event_loop: EventLoop = Field(
        "auto",
        description="event loop: auto (uvloop where installed, else asyncio's), uvloop, asyncio",
    )

    # --- the bounded edge ----------------------------------------------------------------------
    free_paths: str = Field(
        "/tokenize,/detokenize",
        description="Comma-separated POST paths forwarded without a permit (cheap engine calls).",
    )
    forward_paths: str = Field(
        "/v1/,/health",
        description="Comma-separated paths the proxy port forwards to the engine at all (an entry "
        "ending in '/' forwards everything below it), besides SIDECAR_FREE_PATHS; any other path "
        "is a 404 that never reaches the engine. The engine's own /metrics is for Prometheus, on "
        "the engine's port; add it here only to read it through the proxy.",
    )
    client_write_timeout_ms: PositiveInt = Field(
        30_000, description="A write to a client that does not drain in this time ends the stream."
    )
    client_stall_ms: PositiveInt = Field(
        2_000,
        description="While a request waits for a permit, a write to a client that does not "
        "drain in this time ends the stream (client_stalled) and gives its place up: the engine "
        "cannot go on with an answer nobody reads. Nobody waiting, "
        "SIDECAR_CLIENT_WRITE_TIMEOUT_MS applies.",
    )
    header_timeout_ms: PositiveInt = Field(
        10_000,
        description="A request head not complete this long after its first byte (the first "
        "request's: after the connection opened) gets a 408 and the connection closes.",
    )
    keepalive_timeout_ms: PositiveInt = Field(
        15_000, description="An idle keep-alive client connection closes after this time."
    )
    body_timeout_ms: PositiveInt = Field(
        30_000, description="A request body that has not fully arrived in this time gets a 408."
    )
    body_min_rate: NonNegativeInt = Field(
        500,
        description="Bytes a second a request body must keep up over the last "
        "SIDECAR_BODY_RATE_GRACE_MS (the recent pace, not the average since it began); a slower "
        "one gets a 408 (0: no floor, only the body timeout).",
    )
    body_rate_grace_ms: PositiveInt = Field(
        5_000,
        description="The window over which a request body's recent pace is checked: first "
        "after this long, then every half of it.",
    )
    max_connections: PositiveInt = Field(
        4096,
        description="Open client connections on the proxy port. At the cap a connection "
        "holding a partial request head for over a second, else the longest idle one, is closed "
        "to make room; only where there is neither is a new one refused with 503. Sized above "
        "what one GPU's engine runs and queues (vLLM's max_num_seqs 256 to 1024, plus "
        "SIDECAR_MAX_QUEUE): admission, not this cap, decides who waits.",
    )
    max_partial_heads: PositiveInt = Field(
        128,
        description="Proxy-port connections that may hold a request head open (connected, the "
        "head not yet complete) for over a second; past it the oldest is answered 503 "
        "too_many_partial_heads and closed.",
    )
    max_connections_per_client: PositiveInt = Field(
        2048,
        description="Open proxy-port connections from one client address; at it the address's "
        "own partial heads and idle connections make room, and only then is a new one refused "
        "with 503. A gateway speaking HTTP/1.1 holds one connection per concurrent request from "
        "one address: the default lets it fill any engine's sequences and queue. Lower it where "
        "clients connect directly.",
    )
    max_pre_admission: PositiveInt = Field(
        32,
        description="Request bodies checked and prompts counted at once before admission (a "
        "body is awaited outside this cap); more: 503.",
    )
    probe_timeout_ms: PositiveInt = Field(
        2_000, description="Each GPU or engine probe read is abandoned after this time."
    )

    # --- capacity ------------------------------------------------------------------------------
    capacity_source: Literal["auto", "nvml", "vllm", "sglang", "llamacpp", "static"] = Field(
        "auto",
        description="where the KV pool comes from: auto (the engine's, told by its metrics, else "
        "GPU, else static), nvml (GPU), vllm, sglang or llamacpp (that engine's pool), static",
    )
    model: str | None = Field(
        None,
        description="a config.json, a model directory or a preset name (see `sidecar plan --help`)",
    )
    vram_total: Size | None = Field(
        None, description="memory of one GPU (a size); static source, or instead of NVML's reading"
    )
    weights: Size | Literal["auto"] | None = Field(
        None,
        description="whole-model weights (a size), or auto: measured from SIDECAR_MODEL's files",
    )
    overhead: Size = Field(
        2 * 1024**3,
        description="per GPU: CUDA context, activations, fragmentation (a size), when not measured",
    )
    kv_pool: Size | None = Field(
        None,
        description="a declared KV pool per GPU (a size), instead of total x the engine's memory "
        "fraction - weights - overhead",
    )
    engine_memory_fraction: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None,
        description="the share of each GPU the engine sizes itself to (vLLM's "
        "--gpu-memory-utilization, SGLang's --mem-fraction-static), in (0, 1]; unset: the "
        "engine's own where it reports it (vLLM), else 0.9, vLLM's default",
    )
    kv_dtype: str = Field(
        "auto", description="KV cache dtype: auto (the model's), fp16, bf16, fp32, fp8..."
    )
    tensor_parallel_size: PositiveInt = Field(1, description="GPUs in the tensor-parallel group")
    block_size: PositiveInt | None = Field(
        None,
        description="tokens per paged-KV block; unset: the engine's own, where it reports one",
    )
    max_prompt_tokens: PositiveInt | None = Field(
        None,
        description="prompt budget of one request, in tokens; unset: the engine's max_model_len "
        "(3000 until the engine says, or where it does not); set: narrows the engine's",
    )
    max_completion_tokens: PositiveInt | None = Field(
        None,
        description="completion budget of one request (max_tokens), in tokens; unset: the "
        "engine's max_model_len (1000 until the engine says); set: narrows the engine's",
    )
    safety_factor: Annotated[float, Field(gt=0, le=1)] = Field(
        0.8, description="alpha: the share of the KV pool that permits may spend, in (0, 1]"
    )
    gpus: str | None = Field(
        None, description="GPU indexes or UUIDs, comma-separated; unset: every visible GPU"
    )
    engine_metrics_url: str | None = Field(
        None, description="the engine's Prometheus endpoint; unset: SIDECAR_UPSTREAM_URL + /metrics"
    )
    llamacpp_kv_unified: bool = Field(
        True,
        description="llama.cpp: its slots share one KV pool (-kvu, the default with -np auto); "
        "false for -np N without -kvu, where each slot owns -c / N tokens",
    )
    engine_pid: PositiveInt | None = Field(
        None,
        description="the engine's host PID as NVML lists it; unset: the GPU's largest process",
    )
    refresh_ms: PositiveInt = Field(
        1000, description="period of the control loop that recomputes the plan"
    )
    stale_after_ms: PositiveInt = Field(
        10_000,
        description="without a good reading for this long, the plan is stale and the floor applies",
    )
    floor_permits: NonNegativeInt | None = Field(
        None, description="permits while the plan is stale; unset: the static plan's, else 1"
    )
    disagreement_tolerance: Annotated[float, Field(ge=0)] = Field(
        0.10, description="relative gap between the engine's KV pool and NVML's that is reported"
    )

    # --- admission -----------------------------------------------------------------------------
    admission: Literal["auto", "slo", "count", "tokens", "adaptive"] = Field(
        "auto",
        description="auto: slo; slo: requests in flight, a limit steered by the streams' TTFT and "
        "TPOT against their objectives (never past the worst-case permits on an engine that "
        "cannot preempt); count: N worst-case permits; tokens: each request reserves its own "
        "worst case in KV bytes; adaptive: learned completion lengths, a live ledger and a "
        "KV over-commit ratio steered by the engine's preemptions and KV usage",
    )
    slo_ttft_ms: PositiveInt = Field(
        round(_OBJECTIVES.ttft_s * 1000),
        description="time to first token a request is held to when its headers set none "
        "(x-llm-d-slo-ttft-ms, x-slo-ttft-ms)",
    )
    slo_tpot_ms: PositiveInt = Field(
        round(_OBJECTIVES.tpot_s * 1000),
        description="mean time per output token a request is held to when its headers set none "
        "(x-llm-d-slo-tpot-ms, x-slo-tpot-ms)",
    )
    max_wait_ms: NonNegativeInt = Field(
        3000, description="longest wait in the admission queue before the busy answer"
    )
    return_wait_ms: NonNegativeInt = Field(
        30_000,
        description="longest wait in the admission queue for a caller back when a busy answer "
        "told it (the same request again), who has spent its TTFT objective; never less than "
        "SIDECAR_MAX_WAIT_MS. Keep it under what the gateway waits for a first byte (nginx's "
        "proxy_read_timeout and an AWS ALB's idle timeout: 60 s by default)",
    )
    max_queue: NonNegativeInt = Field(
        256,
        description="most requests waiting for a permit; one more gets the busy answer at once. "
        "One engine's worth (vLLM's default max_num_seqs), so that a burst on a fresh pod waits "
        "the fraction of a second the limit takes to find the engine's size instead of being "
        "refused; each waits no longer than SIDECAR_MAX_WAIT_MS (slo: its TTFT objective)",
    )
    shadow: bool = Field(
        False, description="compute and export every decision, enforce none (for a safe roll-out)"
    )
    max_concurrent_calls: PositiveInt | None = Field(
        None, description="hard cap on requests in flight, whatever the plan says; unset: none"
    )
    over_budget: Literal["reject", "clamp"] = Field(
        "reject",
        description="max_tokens over the completion budget: reject (400) or clamp to the budget "
        "(the answer then says so: X-Sidecar-Max-Tokens-Clamped)",
    )
    prompt_bytes_per_token: Annotated[float, Field(gt=0)] = Field(
        4.0, description="prompt estimate: UTF-8 bytes per token"
    )
    media_prompt_tokens: PositiveInt = Field(
        1600,
        description="prompt estimate: tokens per image, video or audio part (what the model's "
        "encoder makes of one, e.g. 576 for LLaVA-1.5, 256 for Gemma 3), never its base64 bytes",
    )
    prompt_tokens: Literal["estimate", "engine"] = Field(
        "estimate",
        description="estimate (from every field the chat template renders: text, names, tool "
        "calls, tools, documents; media per part) or engine (exact, from the engine's POST "
        "/tokenize, for text that tokenizes far from the bytes-per-token rate)",
    )
    overload_memory: Size | None = Field(
        None,
        description="overload manager: the memory the sidecar's resident set is measured "
        "against, e.g. the pod's limit (a size; unset: memory not watched)",
    )
    overload_stop_accepting: Annotated[float, Field(gt=0, le=1)] = Field(
        0.9,
        description="overload manager: share of SIDECAR_OVERLOAD_MEMORY past which new "
        "connections are refused (503 too_many_connections) and, of those doing least, the "
        "share memory is over it is closed each 0.1 s",
    )
    overload_shed: Annotated[float, Field(gt=0, le=1)] = Field(
        0.95,
        description="overload manager: share of SIDECAR_OVERLOAD_MEMORY past which at least 16 "
        "connections doing least are closed each 0.1 s, until memory is back under "
        "SIDECAR_OVERLOAD_STOP_ACCEPTING",
    )
    overload_loop_lag_ms: NonNegativeInt = Field(
        0,
        description="overload manager: event-loop lag past which new connections are refused "
        "(0: not watched)",
    )
    tokenize_timeout_ms: PositiveInt = Field(
        1000,
        description="with prompt_tokens=engine: how long the engine's /tokenize may take; a "
        "count not back by then prices its request by the estimate",
    )
    tokenize_per_client: PositiveInt = Field(
        4,
        description="with prompt_tokens=engine: /tokenize calls one client address may have in "
        "flight (and half of max_pre_admission in all); past it, its requests are priced by the "
        "estimate",
    )
    reject_mode: Literal["sse", "http"] = Field(
        "sse",
        description="busy answer for streams: sse (fallback event) or http (429/503, Retry-After)",
    )
    compartments: str | None = Field(
        None,
        description="compartments as name=share[:cap],..., e.g. gold=50%:80%,silver=0.3",
    )
    compartment_by: Literal["tenant", "priority"] = Field(
        "tenant", description="what picks a request's compartment: tenant or priority"
    )
    claims_from: str = Field(
        "none",
        description="whose tenant, objective, priority and SLO headers are honoured: none, any "
        "(only behind a gateway that strips and sets them), or the gateway's networks as CIDRs, "
        "e.g. 10.0.0.0/8,fd00::/8; from any other peer they are ignored",
    )
    tenant_header: str = Field("x-tenant-id", description="request header naming the tenant")
    tenant_from_api_key: bool = Field(
        True,
        description="a bearer API key names the tenant (key- + 12 hex of its SHA-256), before "
        "any tenant header",
    )
    priority_header: str = Field(
        "x-priority", description="request header naming the priority class"
    )
    sheddable: str | None = Field(
        default=None,
        description="comma-separated priority classes (x-priority or the gateway's "
        "x-llm-d-inference-objective) that are refused at once rather than queued when full",
    )
    objective_priorities: str | None = Field(
        default=None,
        description="InferenceObjective priorities as name=priority,..., e.g. chat=10,batch=-1: "
        "a negative priority is sheddable, as llm-d's router treats it",
    )

    # --- adaptive admission (SIDECAR_ADMISSION=adaptive) ----------------------------------------
    adaptive_min_samples: PositiveInt = Field(
        _ESTIMATOR.min_samples,
        description="completions a band must have seen before its learned lengths replace "
        "max_tokens",
    )
    adaptive_window: PositiveInt = Field(
        _ESTIMATOR.window,
        description="recent completion lengths kept per compartment and max_tokens band",
    )
    adaptive_min_overcommit: Annotated[float, Field(gt=0, le=1)] = Field(
        _AIMD.low, description="lowest over-commit ratio (x alpha x KV pool tokens) AIMD may cut to"
    )
    adaptive_max_overcommit: Annotated[float, Field(ge=1)] = Field(
        _AIMD.high,
        description="highest over-commit ratio AIMD may grow to while the engine is healthy",
    )
    adaptive_increase: Annotated[float, Field(ge=0)] = Field(
        _AIMD.increase,
        description="added to the over-commit ratio on each calm tick the limit binds (requests "
        "wait at the sidecar, KV usage below the target, nothing waiting at the engine)",
    )
    adaptive_decrease: Annotated[float, Field(gt=0, lt=1)] = Field(
        _AIMD.decrease,
        description="the over-commit ratio is multiplied by this when the engine preempts",
    )
    adaptive_kv_target: Annotated[float, Field(gt=0, le=1)] = Field(
        _AIMD.target,
        description="engine KV usage (0..1) adaptive admission holds a busy engine at: below it "
        "the limit grows while requests wait, above it the limit shrinks",
    )

    # --- the scale-out signal (sidecar_utilisation) ---------------------------------------------
    utilisation_window_s: Annotated[float, Field(gt=0)] = Field(
        _SIGNAL.window_s,
        description="the streams' latency, the engine's KV use and running requests, and the "
        "refusals are counted over this many seconds (a scrape and an autoscaler's poll fit in "
        "it; no instant reaches a scrape alone)",
    )
    utilisation_quantile: Annotated[float, Field(gt=0, le=1)] = Field(
        _SIGNAL.quantile,
        description="the latency quantile held against the objectives (0.95: capacity is the "
        "load whose requests meet them 95 % of the time; llm-d's SLO-driven autoscaler holds "
        "P90)",
    )
    utilisation_kv_full: Annotated[float, Field(gt=0, le=1)] = Field(
        _SIGNAL.kv_full,
        description="the engine's KV cache use (0..1) that counts as the pod's whole capacity",
    )
    utilisation_floor_window_s: Annotated[float, Field(gt=0)] = Field(
        _SIGNAL.floor_window_s,
        description="how long the engine's unloaded latency (the latency term's 0) is remembered: "
        "the samples of each load band (1, 2, 3-4, ... requests running) of this many seconds",
    )
    utilisation_floor_cap: Annotated[float, Field(ge=0, lt=1)] = Field(
        _SIGNAL.floor_cap,
        description="the unloaded latency counts at most this share of its objective (a pod "
        "never seen lightly loaded still reads 1 at the objective)",
    )
    engine_max_num_seqs: PositiveInt | None = Field(
        None,
        description="the sequences the engine runs at once (vLLM's --max-num-seqs, times its "
        "--data-parallel-size; its metrics do not state it): where this cap binds before the KV "
        "cache, the scale-out signal counts the engine's running requests against it; unset: "
        "the slots the engine states (llama.cpp's -np), else no such term",
    )

    # --- logs ----------------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="debug, info, warning or error"
    )

    @field_validator(
        "log_level", "kv_dtype", "capacity_source", "admission", "event_loop", mode="before"
    )
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("claims_from")
    @classmethod
    def _claims_from(cls, value: str) -> str:
        parse_claim_trust(value)  # ValueError names the bad entry
        return value

    @field_validator("free_paths", "forward_paths")
    @classmethod
    def _paths(cls, value: str) -> str:
        try:
            parse_forward_paths(value)
        except RequestError as exc:  # a path no request could be normalised to
            raise ValueError(exc.message) from exc
        return value

    @field_validator("compartments")
    @classmethod
    def _compartments(cls, value: str | None) -> str | None:
        try:
            parse_compartments(value)
        except ConfigError as exc:  # named for the setting, like every other bad value
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("objective_priorities")
    @classmethod
    def _priorities(cls, value: str | None) -> str | None:
        parse_priorities(value)  # ValueError names the bad entry
        return value

    @field_validator("weights", mode="before")
    @classmethod
    def _weights_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        size = _read_size(value)
        if isinstance(size, int) and size < 0:
            raise ValueError("weights cannot be negative")
        return size

    @field_validator("upstream_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            msg = "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _ports_differ(self) -> Settings:
        if self.port != 0 and self.port == self.admin_port:
            msg = f"SIDECAR_PORT and SIDECAR_ADMIN_PORT are both {self.port}; they must differ"
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _shed_past_stop(self) -> Settings:
        if self.overload_shed < self.overload_stop_accepting:
            msg = (
                f"SIDECAR_OVERLOAD_SHED ({self.overload_shed}) is below "
                f"SIDECAR_OVERLOAD_STOP_ACCEPTING ({self.overload_stop_accepting}); connections "
                "are shed only past where new ones are refused"
            )
            raise ValueError(msg)
        return self

    @model_validator(mode="after")
    def _static_needs_numbers(self) -> Settings:
        if self.capacity_source == "static" and self.kv_pool is None and self.vram_total is None:
            msg = "SIDECAR_CAPACITY_SOURCE=static needs SIDECAR_KV_POOL or SIDECAR_VRAM_TOTAL"
            raise ValueError(msg)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``environ`` (default: the process environment).

    Raises ConfigError with one line per bad setting, each naming its ``SIDECAR_`` variable.
    """
    given = os.environ if environ is None else environ
    values = {
        key[len(ENV_PREFIX) :].lower(): value
        for key, value in given.items()
        if key.upper().startswith(ENV_PREFIX) and value.strip() != ""
    }
    unknown = sorted(set(values) - set(Settings.model_fields))
    if unknown:
        raise ConfigError("; ".join(_unknown(name) for name in unknown))
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from exc


def _unknown(field: str) -> str:
    close = difflib.get_close_matches(field, list(Settings.model_fields), n=1)
    hint = f" (did you mean {ENV_PREFIX}{close[0].upper()}?)" if close else ""
    return f"unknown setting {ENV_PREFIX}{field.upper()}{hint}"


def _describe(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"] if not isinstance(part, int))
        message = error["msg"].removeprefix("Value error, ")
        if not field:  # a check across settings: its message names them itself
            lines.append(f"invalid settings: {message}")
            continue
        name = f"{ENV_PREFIX}{field.split('.')[0].upper()}"
        given = error.get("input")
        if isinstance(given, str):
            given = redact_url(given)
        shown = f" (got {given!r})" if isinstance(given, str | int | float) else ""
        lines.append(f"invalid setting {name}{shown}: {message}")
    return "; ".join(dict.fromkeys(lines))
