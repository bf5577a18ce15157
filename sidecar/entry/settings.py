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

from pydantic import ByteSize, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sidecar.core.errors import ConfigError

ENV_PREFIX = "SIDECAR_"

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Port = Annotated[int, Field(ge=0, le=65535)]  # 0: any free port (tests)


class Settings(BaseSettings):
    """Every ``SIDECAR_*`` setting, with its default."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # --- network -------------------------------------------------------------------------------
    upstream_url: str = "http://127.0.0.1:8000"
    host: str = "0.0.0.0"  # noqa: S104 - a sidecar listens on the pod's interfaces
    port: Port = 8080
    admin_host: str = "0.0.0.0"  # noqa: S104
    admin_port: Port = 9090
    upstream_connect_timeout_ms: PositiveInt = 2000
    upstream_read_timeout_ms: PositiveInt = 60_000
    max_body_bytes: ByteSize = ByteSize(4 * 1024 * 1024)
    drain_grace_s: Annotated[float, Field(ge=0)] = 30.0

    # --- the bounded edge ----------------------------------------------------------------------
    free_paths: str = Field(
        "/tokenize,/detokenize",
        description="Comma-separated POST paths forwarded without a permit (cheap engine calls).",
    )
    client_write_timeout_ms: PositiveInt = Field(
        30_000, description="A write to a client that does not drain in this time ends the stream."
    )
    header_timeout_ms: PositiveInt = Field(
        10_000, description="A connection whose request head is not complete in this time closes."
    )
    keepalive_timeout_ms: PositiveInt = Field(
        15_000, description="An idle keep-alive client connection closes after this time."
    )
    body_timeout_ms: PositiveInt = Field(
        30_000, description="A request body that has not fully arrived in this time gets a 408."
    )
    max_connections: PositiveInt = Field(
        512, description="Open client connections on the proxy port; more are refused with 503."
    )
    max_pre_admission: PositiveInt = Field(
        32, description="Requests read, parsed and counted at once before admission; more: 503."
    )
    probe_timeout_ms: PositiveInt = Field(
        2_000, description="Each GPU or engine probe read is abandoned after this time."
    )

    # --- capacity ------------------------------------------------------------------------------
    capacity_source: Literal["auto", "nvml", "vllm", "static"] = "auto"
    model: str | None = None
    vram_total: ByteSize | None = None
    weights: ByteSize | Literal["auto"] | None = None
    overhead: ByteSize = ByteSize(2 * 1024**3)
    kv_pool: ByteSize | None = None
    kv_dtype: str = "auto"
    tensor_parallel_size: PositiveInt = 1
    block_size: PositiveInt | None = None
    max_prompt_tokens: PositiveInt = 3000
    max_completion_tokens: PositiveInt = 1000
    safety_factor: Annotated[float, Field(gt=0, le=1)] = 0.8
    gpus: str | None = None
    engine_metrics_url: str | None = None
    engine_pid: PositiveInt | None = None
    refresh_ms: PositiveInt = 1000
    stale_after_ms: PositiveInt = 10_000
    floor_permits: NonNegativeInt | None = None
    disagreement_tolerance: Annotated[float, Field(ge=0)] = 0.10

    # --- admission -----------------------------------------------------------------------------
    admission: Literal["count", "tokens"] = "count"
    max_wait_ms: NonNegativeInt = 3000
    max_queue: NonNegativeInt = 64
    shadow: bool = False
    max_concurrent_calls: PositiveInt | None = None
    over_budget: Literal["reject", "clamp"] = "reject"
    prompt_bytes_per_token: Annotated[float, Field(gt=0)] = 4.0
    prompt_tokens: Literal["estimate", "engine"] = "estimate"
    reject_mode: Literal["sse", "http"] = "sse"
    compartments: str | None = None
    compartment_by: Literal["tenant", "priority"] = "tenant"
    tenant_header: str = "x-tenant-id"
    tenant_from_api_key: bool = True
    priority_header: str = "x-priority"
    sheddable: str | None = Field(
        default=None,
        description="comma-separated priority classes (x-priority or the gateway's "
        "x-gateway-inference-objective) that are refused at once rather than queued when full",
    )

    # --- logs ----------------------------------------------------------------------------------
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("log_level", "kv_dtype", "capacity_source", "admission", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("weights", mode="before")
    @classmethod
    def _weights_auto(cls, value: Any) -> Any:
        return "auto" if isinstance(value, str) and value.strip().lower() == "auto" else value

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
        name = f"{ENV_PREFIX}{field.split('.')[0].upper()}" if field else "settings"
        given = error.get("input")
        shown = f" (got {given!r})" if isinstance(given, str | int | float) else ""
        lines.append(f"invalid setting {name}{shown}: {error['msg']}")
    return "; ".join(dict.fromkeys(lines))
