"""The processes an overload run needs: a real vLLM on CPU, the emulated engine, and a
`sidecar serve` in front of either.

Each leads its own process group and is stopped by its PID (TERM, then KILL after a grace).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

VLLM_VENV = Path(os.environ.get("E2E_VLLM_VENV", "~/.cache/gpu-sidecar/vllm-venv")).expanduser()
MODEL_DIR = Path(os.environ.get("E2E_TINY_MODEL", "~/.cache/gpu-sidecar/tiny-llama")).expanduser()
SERVED_MODEL = "tiny-llama"
KV_CACHE_BYTES = 8 * 1024 * 1024  # 8,192 tokens of the tiny model (1 KiB each)
MAX_MODEL_LEN = 2048
SIDECAR = str(Path(sys.executable).with_name("sidecar"))
# The engine (every vLLM process: API server, engine core, worker; or the emulator) on core 0,
# the clients and the sidecar on the others: vLLM's OMP binding pins only its worker, and its
# engine core (the scheduler, 50-80 % of a core under load) and API server otherwise float onto
# the clients' core, where the sidecar's relaying then slows the engine itself (a pod gives
# each container CPUs of its own). The engine's core is the first this process may use (core 0
# here; a container's cpuset may start elsewhere). Nothing is pinned on a machine with one core.
ENGINE_CPU, *_others = sorted(os.sched_getaffinity(0))
OTHER_CPUS = frozenset(_others)


def on_engine_cpus(command: list[str]) -> list[str]:
    """``command`` run on the engine's core (``taskset``: the process and every child it
    starts), where the machine has other CPUs to keep apart."""
    return ["taskset", "--cpu-list", str(ENGINE_CPU), *command] if OTHER_CPUS else command


def pin_clients() -> None:
    """Keep this process (the clients) off the engine's core, and with it the sidecar it
    starts."""
    if OTHER_CPUS:
        os.sched_setaffinity(0, OTHER_CPUS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; fail if the process exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited ({process.returncode}) before ready")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout_s:.0f} s")


def stop(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    """TERM the process group ``process`` leads; KILL it if it is still there after the grace."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def vllm(flags: tuple[str, ...], log: Path) -> Iterator[str]:
    """A real vLLM on CPU with an 8 MiB KV cache and ``flags``; yields its base URL."""
    port = free_port()
    command = [
        str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
        "--kv-cache-memory-bytes", str(KV_CACHE_BYTES), *flags,
    ]  # fmt: skip
    # vLLM's OMP threads on the engine's core too (see ENGINE_CPU).
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": str(ENGINE_CPU),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            on_engine_cpus(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", process, 300)
        yield url
    finally:
        stop(process)


@contextlib.contextmanager
def emulator(flags: tuple[str, ...], log: Path) -> Iterator[str]:
    """``python -m emulator`` with ``flags`` (this venv's); yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "emulator", "--host", "127.0.0.1", "--port", str(port), *flags]
    with log.open("wb") as out:
        process = subprocess.Popen(
            on_engine_cpus(command), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", process, 60)
        yield url
    finally:
        stop(process)


@contextlib.contextmanager
def sidecar(
    upstream: str,
    mode: str | None,
    log: Path,
    program: str | None = None,
    *,
    prefix: Sequence[str] = (),
    **extra: str,
) -> Iterator[str]:
    """`sidecar serve` in front of ``upstream`` with default settings, but for the admission
    mode (None: the default) and ``extra`` SIDECAR_* settings; yields its base URL. ``program``:
    another build's ``sidecar`` (None: this checkout's); ``prefix``: a command it is started
    behind (one that ends by exec'ing it, so that its PID is the one stopped)."""
    with sidecar_ports(upstream, mode, log, program, prefix=prefix, **extra) as (url, _admin):
        yield url


@contextlib.contextmanager
def sidecar_ports(
    upstream: str,
    mode: str | None,
    log: Path,
    program: str | None = None,
    *,
    prefix: Sequence[str] = (),
    **extra: str,
) -> Iterator[tuple[str, str]]:
    """:func:`sidecar`, yielding its proxy URL and its admin URL (``/metrics``)."""
    started = sidecar_process(upstream, mode, log, program, prefix=prefix, **extra)
    with started as (_process, url, admin):
        yield url, admin


@contextlib.contextmanager
def sidecar_process(
    upstream: str,
    mode: str | None,
    log: Path,
    program: str | None = None,
    *,
    prefix: Sequence[str] = (),
    **extra: str,
) -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    """:func:`sidecar_ports`, yielding the process too (its PID, to sample its memory)."""
    port, admin = free_port(), free_port()
    env = {
        **os.environ,
        "SIDECAR_UPSTREAM_URL": upstream,
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_PORT": str(port),
        "SIDECAR_ADMIN_HOST": "127.0.0.1",
        "SIDECAR_ADMIN_PORT": str(admin),
        "SIDECAR_LOG_LEVEL": os.environ.get("OVERLOAD_SIDECAR_LOG_LEVEL", "warning"),
        **{f"SIDECAR_{key.upper()}": value for key, value in extra.items()},
    }
    env.pop("SIDECAR_ADMISSION", None)
    if mode is not None:
        env["SIDECAR_ADMISSION"] = mode
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*prefix, program or SIDECAR, "serve"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_ready(f"http://127.0.0.1:{admin}/readyz", process, 60)
        yield process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
    finally:
        stop(process)
