"""What an overload run measures: the configurations in front of the engine, the loads, the
engines' flags, and the order of the runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from benchmarks.overload.load import LONG_WORDS, SHORT_WORDS, Load

CLIENTS = 96
QUEUED_REQS = 32  # vLLM --max-num-queued-reqs: in flight, waiting and running together
QUEUED_TOKENS = 2048  # vLLM --max-num-queued-tokens: prompt tokens still in prefill
OPEN_FACTOR = 1.5  # open-long offers this many times vLLM alone's closed-long completions/s
# The engine alone at fewer clients, for its best operating point: around the 36 clients where
# vLLM alone served the most within the objectives on closed-short, and the 23 requests that
# fill the GPU-shaped engine's cache; ALONE's 96 clients is a point of the sweep too.
DEFAULT_SWEEP = (24, 36, 48)

# The GPU-shaped engine: Llama 2 13B (40 layers x 40 KV heads x 128 x 2 bytes x K and V:
# 800 KiB of KV a token, no grouped-query attention) in BF16 on one H100 SXM 80 GB. Its KV
# cache: 44 GiB (0.9 x 80 GB, less 26 GB of weights and ~2 GB of activations), 57,664 tokens.
# Its prefill: 989 TFLOPS (the H100 SXM datasheet's dense BF16 peak) at 40 % utilisation,
# 2 FLOPs per parameter per token: 989e12 x 0.4 / 26e9 = 15,200 tokens/s. Its decode: 40 steps
# a second (each step reads 26 GB of weights and up to 44 GB of KV at 3.35 TB/s: 8-21 ms,
# plus the step's overhead). Prompts of 2,000 tokens and hidden completions of a median 512
# (up to 2,048): about 23 requests fill the cache, a preemption happens every few completions,
# and each costs every running stream 0.13-0.2 s of recompute (prompt and generated tokens):
# five to eight decode steps.
GPU_ENGINE_FLAGS = (
    "--model-name", "llama-2-13b", "--num-gpu-blocks", "3604", "--block-size", "16",
    "--bytes-per-token", "819200", "--max-model-len", "4096", "--max-num-seqs", "256",
    "--max-num-batched-tokens", "8192", "--prefill-tokens-per-s", "15200",
    "--tokens-per-s", "40", "--completion-median-ratio", "0.25", "--completion-sigma", "1.0",
)  # fmt: skip
GPU_MODEL = "llama-2-13b"
GPU_PROMPT_WORDS = 2000  # the emulator counts a word a token: 2,000-token prompts
GPU_MAX_TOKENS = 2048  # prompt and completion within max_model_len 4,096
# The emulated engine's words average 6.8 bytes with their space; the tiny Llama's tokenizer
# makes about 2 bytes a token (real tokenizers about 4, the sidecar's default).
SIDECAR_SETTINGS = {
    "vllm": {
        "max_prompt_tokens": "1000",
        "max_completion_tokens": "1024",
        "prompt_bytes_per_token": "2",
    },
    "emulator": {
        "max_prompt_tokens": "2048",
        "max_completion_tokens": "2048",
        "prompt_bytes_per_token": "6.8",
    },
}


@dataclass(frozen=True, slots=True)
class Config:
    """What stands in front of the engine: nothing, one of the engine's own caps, the sidecar."""

    name: str
    cap_flag: str | None = None  # the engine's own cap, by vLLM's flag name
    behind_sidecar: bool = False
    settings: tuple[tuple[str, str], ...] = ()  # SIDECAR_* settings of its own (lower case)
    program: str | None = None  # another build's `sidecar` (None: this checkout's)
    clients: int | None = None  # a sweep point: the engine alone at this many closed-loop clients

    def engine_flags(self, engine: str) -> tuple[str, ...]:
        if self.cap_flag is None:
            return ()
        value = QUEUED_REQS if self.cap_flag == "--max-num-queued-reqs" else QUEUED_TOKENS
        return (self.cap_flag, str(value))

    def runs_on(self, spec: LoadSpec) -> bool:
        """The emulator has vLLM's request cap, not its token cap; a sweep point needs a client
        count to change, which an open loop has not."""
        if self.clients is not None and not spec.closed:
            return False
        return spec.engine == "vllm" or self.cap_flag != "--max-num-queued-tokens"

    def label(self, engine: str) -> str:
        if self.behind_sidecar:
            own = ", ".join(f"{key}={value}" for key, value in self.settings)
            build = f" ({self.program})" if self.program else ""
            return f"sidecar{build}, {own or 'defaults'}"
        if self.clients is not None:
            return f"{engine} alone, {self.clients} clients"
        return " ".join(
            (engine + (" alone" if self.cap_flag is None else ""), *self.engine_flags(engine))
        )


def sidecar_settings(text: str) -> tuple[tuple[str, str], ...]:
    """``OVERLOAD_SIDECAR_B``'s settings: ``key=value`` pairs, comma-separated (keys as in
    SIDECAR_KEY, any case), e.g. ``slo_law=queue,max_wait_ms=1000``."""
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    if any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
        raise SystemExit(f"OVERLOAD_SIDECAR_B: need key=value,...; got {text!r}")
    return tuple((key.strip().lower(), value.strip()) for key, value in pairs)


ALONE, CAP, TOKENS_CAP, OURS, OURS_B = (
    "alone",
    "queued-reqs",
    "queued-tokens",
    "sidecar",
    "sidecar-b",
)
CONFIGS = (
    Config(ALONE),
    Config(CAP, "--max-num-queued-reqs"),
    Config(TOKENS_CAP, "--max-num-queued-tokens"),
    Config(OURS, behind_sidecar=True),
    # A second sidecar with settings of its own, to compare two settings in one run.
    Config(
        OURS_B,
        behind_sidecar=True,
        settings=sidecar_settings(os.environ.get("OVERLOAD_SIDECAR_B", "")),
        program=os.environ.get("OVERLOAD_SIDECAR_B_PROGRAM") or None,
    ),
)
DEFAULT_CONFIGS = (ALONE, CAP, OURS)


class SettingError(Exception):
    """An OVERLOAD_* setting the run cannot use; its message is one line naming the setting."""


def sweep(env: Mapping[str, str]) -> tuple[Config, ...]:
    """``OVERLOAD_SWEEP``'s sweep points: the engine alone at each client count (comma-separated,
    default DEFAULT_SWEEP; ``none`` for no sweep), fewest clients first."""
    text = env.get("OVERLOAD_SWEEP", "").strip()
    if text.lower() == "none":
        return ()
    items = [item.strip() for item in text.split(",")] if text else None
    if items is not None and not all(item.isdecimal() and int(item) > 0 for item in items):
        raise SettingError(
            f"OVERLOAD_SWEEP: need client counts of 1 or more like 24,36,48, or none; got {text!r}"
        )
    counts = DEFAULT_SWEEP if items is None else sorted({int(item) for item in items})
    return tuple(Config(f"{ALONE}-{n}", clients=n) for n in counts)


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """A load and the engine it runs on; an open load's rate is set at run time."""

    name: str
    engine: str  # "vllm" or "emulator"
    prompt_words: int
    closed: bool = True
    model: str = "tiny-llama"
    max_tokens: int = 1024
    # The least warm-up before its window opens, whatever OVERLOAD_WARMUP_S says: the time the
    # streams of the first burst take to end, so that the window measures the steady state and
    # not the cold start (which make bench-cold-start measures on its own).
    warmup_s: float = 0.0

    def describe(self) -> str:
        """One line for the report."""
        engine = (
            "vLLM 0.32 on CPU, tiny Llama"
            if self.engine == "vllm"
            else ("the emulated engine as Llama 2 13B on one H100")
        )
        shape = (
            f"closed loop, {CLIENTS} clients"
            if self.closed
            else (
                f"open loop, Poisson arrivals at {OPEN_FACTOR}x vLLM alone's closed-long "
                "completions/s, nobody retries"
            )
        )
        tokens = {SHORT_WORDS: "~30", LONG_WORDS: "~400"}.get(
            self.prompt_words, f"{self.prompt_words:,}"
        )
        warm = (
            f"; measured after at least {self.warmup_s:g} s of warm-up, when the first burst's "
            "streams have ended"
            if self.warmup_s
            else ""
        )
        return f"{engine}; {shape}; {tokens}-token prompts{warm}"

    def load(self, rate: float = 0.0, clients: int | None = None) -> Load:
        """The load at ``rate`` (an open loop's) or ``clients`` (a closed loop's, default
        CLIENTS)."""
        if self.closed:
            return Load(
                self.name, self.prompt_words, clients=clients or CLIENTS, max_tokens=self.max_tokens
            )
        return Load(self.name, self.prompt_words, rate=rate, max_tokens=self.max_tokens)


LOADS = (
    LoadSpec("closed-short", "vllm", SHORT_WORDS),
    LoadSpec("closed-long", "vllm", LONG_WORDS),
    LoadSpec("open-long", "vllm", LONG_WORDS, closed=False),
    # Its streams run 17-40 s: after 10 s, the window would count the first burst's queue (96
    # prefills of 2,000 tokens at once) in every configuration, and little else.
    LoadSpec(
        "gpu-long",
        "emulator",
        GPU_PROMPT_WORDS,
        model=GPU_MODEL,
        max_tokens=GPU_MAX_TOKENS,
        warmup_s=40.0,
    ),
)


def chosen(env: str, names: tuple[str, ...], default: tuple[str, ...]) -> tuple[str, ...]:
    """The names listed in ``env`` (comma-separated), in the canonical order; else default."""
    wanted = os.environ.get(env)
    picked = default if not wanted else tuple(wanted.split(","))
    unknown = set(picked) - set(names)
    if unknown:
        raise SystemExit(f"{env}: unknown {', '.join(sorted(unknown))}; known: {', '.join(names)}")
    return tuple(n for n in names if n in picked)


def schedule(
    repetitions: int, loads: tuple[LoadSpec, ...], configs: tuple[Config, ...]
) -> list[tuple[int, LoadSpec, Config]]:
    """Every (repetition, load, configuration): repetition by repetition, so that drift on the
    machine meets every configuration alike, and the configurations' order turned by one each
    repetition, so that none always runs first after a load change."""
    runs = []
    for rep in range(repetitions):
        for spec in loads:
            here = [c for c in configs if c.runs_on(spec)]
            turn = rep % len(here) if here else 0
            runs += [(rep, spec, c) for c in here[turn:] + here[:turn]]
    return runs
