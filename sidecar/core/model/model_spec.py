"""Find a model and what its files say: a config.json path, a model directory, a Hugging Face id in
the local cache, or a built-in preset; with the weight bytes each one tells, and where from.

The only file readers of the capacity math; `config_json.spec_from_config` does the reading proper.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from sidecar.core.errors import ModelConfigError
from sidecar.core.model.hub_cache import cached_snapshot, is_hub_id
from sidecar.core.model.preset_ids import preset_for_hub_id
from sidecar.core.plan.capacity import Source, Term
from sidecar.core.plan.config_json import ModelSpec, spec_from_config
from sidecar.core.plan.model_shape import ModelShape, shape_from_config

WEIGHT_SUFFIXES = ((".safetensors",), (".bin", ".pt"), (".gguf",))
SAFETENSORS_INDEX = "model.safetensors.index.json"
PRESET_META = "_sidecar_preset"  # our key in a preset file; the rest is the model's config.json


@dataclass(frozen=True, kw_only=True)
class Model:
    """A model's KV-cache spec, its weights when known, and where both were found."""

    spec: ModelSpec
    weights: Term | None  # whole-model weight bytes: from a preset or measured from files
    found: str  # "preset qwen2.5-7b", "local Hugging Face cache: <dir>", "<path>"
    directory: Path | None = None  # where its files are; None for a preset
    shape: ModelShape | None = None  # the forward's widths, for the overhead estimate


def preset_names() -> list[str]:
    """Names of the built-in presets, e.g. "qwen2.5-7b"."""
    folder = resources.files("sidecar.core.model") / "presets"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_model_spec(ref: str) -> ModelSpec:
    """Load a spec from a config.json path, a model directory, or a preset name."""
    return load_model(ref).spec


def load_model(ref: str, hub_cache: Path | None = None) -> Model:
    """Find `ref`: a config.json, a model directory, an "org/name" id in the Hugging Face cache
    at `hub_cache` (when given), or a preset (by name, or by an id it answers to)."""
    path = Path(ref)
    if path.is_dir():
        return _in_folder(path, path.name, str(path))
    if path.is_file() and path.name == "config.json":  # a model directory's own config
        return _in_folder(path.parent, path.parent.name or path.stem, ref)
    if path.is_file():
        cfg = _read_json(path)
        spec = spec_from_config(cfg, path.stem)
        return Model(
            spec=spec, weights=None, found=ref, directory=path.parent, shape=shape_from_config(cfg)
        )
    snapshot = cached_snapshot(ref, hub_cache) if hub_cache and is_hub_id(ref) else None
    if snapshot is not None:
        return _in_folder(snapshot, ref, f"local Hugging Face cache: {snapshot}")
    key = _preset_key(ref)
    if key in preset_names():
        return _preset(key)
    presets = ", ".join(preset_names())
    msg = f"no config.json at {ref!r} and no preset of that name (presets: {presets})"
    raise ModelConfigError(msg)


def _in_folder(folder: Path, name: str, found: str) -> Model:
    """A model directory's spec, weights and shape. Where config.json names no dtype (gpt-oss),
    the weights' own dtypes stand in, as vLLM reads them (vllm/config/model.py, _find_dtype)."""
    cfg = _read_json(folder / "config.json")
    nested = cfg.get("text_config")
    parts = (cfg, nested) if isinstance(nested, dict) else (cfg,)
    if not any(part.get(k) for part in parts for k in ("torch_dtype", "dtype")):
        dtype = _safetensors_dtype(folder)
        if dtype is not None:
            cfg["torch_dtype"] = dtype
    spec = spec_from_config(cfg, name)
    return Model(
        spec=spec,
        weights=_weights_or_none(folder),
        found=found,
        directory=folder,
        shape=shape_from_config(cfg),
    )


def _preset_key(ref: str) -> str:
    """ "Qwen/Qwen2.5-7B-Instruct" -> "qwen2.5-7b": tuned variants share the base's config."""
    listed = preset_for_hub_id(ref)
    if listed is not None:
        return listed
    key = ref.rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-it", "-hf", "-chat", "-base"):
        key = key.removesuffix(suffix)
    return key.removeprefix("ai21-").replace("meta-llama-", "llama-").replace("-v0.1", "")


def _preset(key: str) -> Model:
    text = (resources.files("sidecar.core.model") / "presets" / f"{key}.json").read_text("utf-8")
    cfg = _parse_json(text, key)
    meta = cfg.pop(PRESET_META, {})
    if not any(cfg.get(k) for k in ("torch_dtype", "dtype")) and "dtype" in meta:
        cfg["torch_dtype"] = meta["dtype"]  # e.g. gpt-oss: config.json names none
    spec = spec_from_config(cfg, key)
    return Model(
        spec=spec,
        weights=preset_weights(meta),
        found=f"preset {key}",
        directory=None,
        shape=shape_from_config(cfg),
    )


def preset_weights(meta: Mapping[str, Any]) -> Term | None:
    """A preset's weight bytes: the Hub's published total, else parameters x bytes each."""
    if "weights_bytes" in meta:
        detail = str(meta["weights_from"])
        return Term(
            name="weights",
            bytes=int(meta["weights_bytes"]),
            source=Source.PRESET,
            observed_at=None,
            detail=detail,
        )
    if "parameters" in meta:
        count, each = int(meta["parameters"]), int(meta["parameter_bytes"])
        detail = f"estimated from {count:,} parameters x {each} B"
        return Term(
            name="weights",
            bytes=count * each,
            source=Source.PRESET,
            observed_at=None,
            detail=detail,
        )
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return _parse_json(text, str(path))


def _parse_json(text: str, where: str) -> dict[str, Any]:
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{where} is not a JSON object")
    return cfg


def weights_bytes_in(directory: str | Path) -> int:
    """Total size of a model directory's weights, preferring safetensors as engines do."""
    return weights_in(directory).bytes


def weights_in(directory: str | Path) -> Term:
    """A model directory's weights, measured; ModelConfigError when it holds none."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ModelConfigError(
            f"--weights auto needs a model directory, {str(folder)!r} is not one"
        )
    weights = _weights_or_none(folder)
    if weights is None:
        msg = f"no weight files (*.safetensors, *.bin, *.pt, *.gguf) in {folder}"
        raise ModelConfigError(msg)
    return weights


def _weights_or_none(folder: Path) -> Term | None:
    """The safetensors index's total_size (the tensors an engine loads, and only those it lists:
    not a consolidated.safetensors copy beside them), else the weight files' sizes summed."""
    total = _index_total(folder / SAFETENSORS_INDEX)
    if total is not None:
        detail = f"{SAFETENSORS_INDEX} total_size in {folder}"
        return Term(
            name="weights", bytes=total, source=Source.MEASURED, observed_at=None, detail=detail
        )
    for suffixes in WEIGHT_SUFFIXES:
        files = [p for p in folder.iterdir() if p.is_file() and p.name.endswith(suffixes)]
        if files:
            size = sum(p.stat().st_size for p in files)  # stat() follows the cache's blob links
            detail = f"{len(files)} *{suffixes[0]} files in {folder}"
            return Term(
                name="weights", bytes=size, source=Source.MEASURED, observed_at=None, detail=detail
            )
    return None


# Floating dtypes as safetensors headers spell them; any two together promote to float32 in torch.
_SAFETENSORS_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on a header


def _safetensors_dtype(folder: Path) -> str | None:
    """The dtype the model's floating tensors share (BF16 beside U8 MXFP4 blocks or FP8 weights
    is bfloat16); None without safetensors or floating tensors."""
    floats = {
        _SAFETENSORS_FLOATS[entry["dtype"]]
        for file in sorted(folder.glob("*.safetensors"))
        for name, entry in _safetensors_header(file).items()
        if name != "__metadata__"
        and isinstance(entry, dict)
        and entry.get("dtype") in _SAFETENSORS_FLOATS
    }
    if not floats:
        return None
    return floats.pop() if len(floats) == 1 else "float32"


def _safetensors_header(file: Path) -> dict[str, Any]:
    """A safetensors file's header: 8 bytes of little-endian length, then that much JSON."""
    with file.open("rb") as stream:
        size = int.from_bytes(stream.read(8), "little")
        if not 2 <= size <= _MAX_HEADER:
            raise ModelConfigError(f"{file} is not a safetensors file (header of {size} B)")
        return _parse_json(stream.read(size).decode("utf-8", "replace"), str(file))


def _index_total(index: Path) -> int | None:
    """metadata.total_size of a safetensors index; None when there is no index."""
    if not index.is_file():
        return None
    metadata = _read_json(index).get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise ModelConfigError(f"{index} has no positive metadata.total_size")
    return total
