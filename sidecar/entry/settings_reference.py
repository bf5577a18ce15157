"""Every ``SIDECAR_*`` setting as a row (name, type, default, description, group), from the model.

`sidecar serve --help` and docs/settings.md are both made from these rows, so neither can drift
from the code: a setting without a description fails its test.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BeforeValidator
from pydantic.fields import FieldInfo

from sidecar.entry.settings import ENV_PREFIX, GROUP_STARTS, Settings

_UNITS = (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))
_SCALARS = {int: "int", float: "float", bool: "bool", str: "text"}


@dataclass(frozen=True, kw_only=True)
class SettingRow:
    """One setting as a reader sees it."""

    env: str
    type: str
    default: str
    description: str
    group: str


def setting_rows(model: type[Settings] = Settings) -> tuple[SettingRow, ...]:
    """Every field of ``model``, in declaration order, with the group it sits in."""
    rows = []
    group = "other"
    for name, field in model.model_fields.items():
        group = GROUP_STARTS.get(name, group)
        kind = _type_of(field)
        rows.append(
            SettingRow(
                env=f"{ENV_PREFIX}{name.upper()}",
                type=kind,
                default=_default_of(field, kind),
                description=field.description or "",
                group=group,
            )
        )
    return tuple(rows)


def grouped(rows: Iterable[SettingRow]) -> dict[str, list[SettingRow]]:
    """Rows by group, groups in first-seen order."""
    groups: dict[str, list[SettingRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    return groups


def _type_of(field: FieldInfo) -> str:
    return _describe(field.annotation, list(field.metadata))


def _describe(annotation: Any, metadata: Sequence[Any]) -> str:
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return _describe(inner, [*metadata, *extra])
    if origin in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        return " or ".join(_describe(arg, metadata) for arg in members)
    if origin is Literal:
        return "|".join(str(arg) for arg in get_args(annotation))
    if any(isinstance(item, BeforeValidator) for item in metadata):
        return "size"
    base = _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return base + _range(dict(_bounds(metadata)))


def _bounds(metadata: Sequence[Any]) -> Iterable[tuple[str, Any]]:
    for item in metadata:
        if isinstance(item, annotated_types.BaseMetadata):
            for attr in ("gt", "ge", "lt", "le"):
                if getattr(item, attr, None) is not None:
                    yield attr, getattr(item, attr)
        for nested in getattr(item, "metadata", ()):
            yield from _bounds([nested])


def _range(bounds: dict[str, Any]) -> str:
    low = ("(", bounds["gt"]) if "gt" in bounds else ("[", bounds.get("ge"))
    high = (")", bounds["lt"]) if "lt" in bounds else ("]", bounds.get("le"))
    if low[1] is not None and high[1] is not None:
        return f" in {low[0]}{low[1]}, {high[1]}{high[0]}"
    if low[1] is not None:
        return f" {'>' if low[0] == '(' else '>='} {low[1]}"
    if high[1] is not None:
        return f" {'<' if high[0] == ')' else '<='} {high[1]}"
    return ""


def _default_of(field: FieldInfo, kind: str) -> str:
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if kind.startswith("size") and isinstance(value, int):
        return _short_size(value)
    return str(value)


def _short_size(n: int) -> str:
    for unit, scale in _UNITS:
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def help_text(rows: Iterable[SettingRow]) -> str:
    """The settings as `sidecar serve --help` shows them: by group, two lines each."""
    lines = ["settings (environment variables; sizes like 24GiB, 24Gi, 24GB or bytes):"]
    for group, members in grouped(rows).items():
        lines.append(f"\n  {group}:")
        for row in members:
            lines.append(f"    {row.env}  ({row.type}; default {row.default})")
            lines.append(f"        {row.description}")
    return "\n".join(lines)
