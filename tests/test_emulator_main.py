"""``python -m emulator`` as a real process: flags, the ready line, serving, clean stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable

import pytest

from emulator.__main__ import build_parser, config_from_args, main


def test_flags_build_the_config() -> None:
    """vLLM-style flags map onto the config, --num-gpu-blocks sizing the pool in blocks."""
    args = build_parser().parse_args(
        ["--num-gpu-blocks", "200", "--block-size", "32", "--max-num-seqs", "8", "--oom"]
    )
    config = config_from_args(args)
    assert (config.num_gpu_blocks, config.kv_cache_size_tokens) == (200, 6400)
    assert (config.max_num_seqs, config.oom, config.tokens_per_s) == (8, True, 40.0)
    assert (config.prefill_tokens_per_s, config.max_num_batched_tokens) == (10_000.0, 8192)
    assert config.max_num_queued_reqs is None


def test_queue_cap_flag_takes_vllms_name() -> None:
    """--max-num-queued-reqs, as vLLM spells it; a negative cap is refused."""
    config = config_from_args(build_parser().parse_args(["--max-num-queued-reqs", "32"]))
    assert config.max_num_queued_reqs == 32
    with pytest.raises(ValueError, match="max_num_queued_reqs must not be negative"):
        config.replace(max_num_queued_reqs=-1)


@pytest.mark.parametrize(
    ("engine", "fails_on_overflow"),
    [
        pytest.param("vllm", False, id="vllm-preempts"),
        pytest.param("sglang", False, id="sglang-retracts"),
        pytest.param("llamacpp", True, id="llamacpp-fails"),
    ],
)
def test_engine_flag_picks_whose_metrics_it_speaks(engine: str, fails_on_overflow: bool) -> None:
    """--engine sets the dialect; as llama.cpp the engine fails on overflow instead of
    preempting, as llama.cpp never preempts."""
    config = config_from_args(build_parser().parse_args(["--engine", engine]))
    assert (config.engine, config.fails_on_overflow) == (engine, fails_on_overflow)


def test_unknown_engine_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An engine the emulator cannot speak stops it before it serves anything."""
    with pytest.raises(SystemExit) as raised:
        main(["--engine", "tgi"])
    assert raised.value.code == 2
    assert "invalid choice: 'tgi'" in capsys.readouterr().err


def test_impossible_pool_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A pool smaller than one max_model_len request is a usage error, like vLLM refusing."""
    with pytest.raises(SystemExit) as exited:
        main(["--kv-tokens", "100", "--max-model-len", "4096"])
    assert exited.value.code == 2
    assert "cannot hold one request" in capsys.readouterr().err


def test_process_prints_ready_line_serves_and_stops_on_sigterm(
    held_port: Callable[[], int],
) -> None:
    """The process logs one JSON ready event, answers /health, and exits 0 on SIGTERM."""
    port = held_port()
    command = [sys.executable, "-m", "emulator", "--port", str(port), "--kv-tokens", "8192"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            ready = json.loads(process.stdout.readline())
            assert ready["event"] == "emulator_ready"
            assert ready["url"] == f"http://127.0.0.1:{port}"
            assert ready["num_gpu_blocks"] == 512
            with urllib.request.urlopen(f"{ready['url']}/health", timeout=5) as response:
                assert response.status == 200
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
