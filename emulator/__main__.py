"""``python -m emulator``: run the emulated engine as a process, like ``vllm serve``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

import structlog
from aiohttp import web

from emulator.app import build_app
from emulator.config import ENGINES, EmulatorConfig


def build_parser() -> argparse.ArgumentParser:
    """The command line, with vLLM's flag names where vLLM has one."""
    defaults = EmulatorConfig()
    parser = argparse.ArgumentParser(prog="python -m emulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=defaults.engine,
        help="whose /metrics to speak (llamacpp adds /props and /slots, and fails on overflow)",
    )
    parser.add_argument("--model-name", default=defaults.model_name)
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    pool = parser.add_mutually_exclusive_group()
    pool.add_argument("--kv-tokens", type=int, default=defaults.kv_tokens)
    pool.add_argument("--num-gpu-blocks", type=int, help="size the pool in blocks instead")
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--tokens-per-s", type=float, default=40.0, help="per stream; 0 = max")
    parser.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=10_000.0,  # like --tokens-per-s 40, a GPU's pace: a recompute costs its time
        help="engine compute: each token a step computes adds 1/this to the step; 0 = free",
    )
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens
    )
    parser.add_argument("--ttft-s", type=float, default=defaults.ttft_s)
    parser.add_argument(
        "--max-num-queued-reqs",
        type=int,
        default=None,
        help="vLLM's cap on unfinished requests (waiting + running); beyond it a 503 at once",
    )
    parser.add_argument("--bytes-per-token", type=int, default=defaults.bytes_per_token)
    parser.add_argument("--oom", action="store_true", help="fail streams when KV runs out")
    parser.add_argument(
        "--completion-median-ratio",
        type=float,
        help="completions end early: lognormal, median max_tokens x this, capped at max_tokens",
    )
    parser.add_argument("--completion-sigma", type=float, default=defaults.completion_sigma)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    return parser


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """The configuration the flags describe."""
    kv_tokens = args.kv_tokens
    if args.num_gpu_blocks is not None:
        kv_tokens = args.num_gpu_blocks * args.block_size
    return EmulatorConfig(
        engine=args.engine,
        model_name=args.model_name,
        max_model_len=args.max_model_len,
        kv_tokens=kv_tokens,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        tokens_per_s=args.tokens_per_s,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        max_num_batched_tokens=args.max_num_batched_tokens,
        ttft_s=args.ttft_s,
        max_num_queued_reqs=args.max_num_queued_reqs,
        oom=args.oom,
        bytes_per_token=args.bytes_per_token,
        completion_median_ratio=args.completion_median_ratio,
        completion_sigma=args.completion_sigma,
        seed=args.seed,
    )


async def serve(config: EmulatorConfig, host: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM; print one JSON line once the port is open."""
    runner = web.AppRunner(build_app(config), handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        structlog.get_logger("emulator").info(
            "emulator_ready",
            url=f"http://{host}:{runner.addresses[0][1]}",  # the bound port, also for --port 0
            engine=config.engine,
            model_name=config.model_name,
            num_gpu_blocks=config.num_gpu_blocks,
            block_size=config.block_size,
            kv_cache_size_tokens=config.kv_cache_size_tokens,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes,
            max_num_seqs=config.max_num_seqs,
            tokens_per_s=config.tokens_per_s,
            prefill_tokens_per_s=config.prefill_tokens_per_s,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_num_queued_reqs=config.max_num_queued_reqs,
            oom=config.fails_on_overflow,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()


def configure_logging() -> None:
    """One JSON object per line on stdout; launchers wait for the ``emulator_ready`` event."""
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, validate, serve; a bad configuration exits 2 with one line."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    configure_logging()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
