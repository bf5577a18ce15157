"""Find a Hugging Face model id's files in the local Hub cache, without the network.

The cache is where `huggingface_hub` puts downloads, chosen by the same variables in the same order
(huggingface_hub/constants.py): ``HF_HUB_CACHE``, the older ``HUGGINGFACE_HUB_CACHE``,
``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``, then ``~/.cache/huggingface/hub``. A model
``org/name`` lives in ``models--org--name/``: ``refs/main`` holds the commit that
``snapshots/<commit>/`` is a checkout of (its files are links into ``blobs/``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from sidecar.core.errors import ModelConfigError

# What the Hub allows in an owner or a repository name; anything else is not an id.
_HUB_ID = re.compile(r"(?P<owner>[\w.-]+)/(?P<name>[\w.-]+)")


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The cache directory `huggingface_hub` would use with this environment."""
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    cache_home = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME") or "~") / ".cache")
    return cache_home.expanduser() / "huggingface" / "hub"


def is_hub_id(ref: str) -> bool:
    """True for "org/name": a Hugging Face model id rather than a file or a preset."""
    return _HUB_ID.fullmatch(ref) is not None


def cached_snapshot(ref: str, cache: Path) -> Path | None:
    """The snapshot directory of `ref` ("org/name") in the cache; None when it was never fetched.

    The Hub treats ids without regard to letter case, so the cache folder may be spelled either way.
    """
    folder = _repo_folder(ref, cache)
    if folder is None:
        return None
    snapshots = folder / "snapshots"
    ref_file = folder / "refs" / "main"
    if ref_file.is_file():
        commit = ref_file.read_text(encoding="utf-8").strip()
        if (snapshots / commit).is_dir():
            return snapshots / commit
    checkouts = sorted(p for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
    if len(checkouts) == 1:  # fetched by commit: no refs/main, one checkout
        return checkouts[0]
    if not checkouts:
        raise ModelConfigError(f"{ref}: the Hugging Face cache at {folder} holds no snapshot")
    names = ", ".join(p.name for p in checkouts)
    msg = f"{ref}: {folder} holds several snapshots ({names}) and no refs/main to choose one"
    raise ModelConfigError(msg)


def _repo_folder(ref: str, cache: Path) -> Path | None:
    wanted = "models--" + ref.replace("/", "--")
    exact = cache / wanted
    if exact.is_dir():
        return exact
    if not cache.is_dir():
        return None
    for entry in cache.iterdir():
        if entry.name.lower() == wanted.lower() and entry.is_dir():
            return entry
    return None
