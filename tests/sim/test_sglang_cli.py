"""``pitstop sim serve --engine sglang``: SGLang's launch flags, its defaults, and the vLLM face left as it was."""

from __future__ import annotations

import pytest

from enginesim.cli import serve_config
from enginesim.sglang import DEFAULT_PORT, TTFT_BUCKETS, max_running_requests


def test_sglang_flags_and_defaults() -> None:
    config, ignored = serve_config(["--engine", "sglang", "--model-path", "meta-llama/Llama-3.1-8B-Instruct"], {})
    options = config.sglang
    assert options is not None
    assert config.model == "meta-llama/Llama-3.1-8B-Instruct" and config.names == [config.model]
    assert (config.host, config.port) == ("127.0.0.1", DEFAULT_PORT)
    assert not options.enable_metrics and options.dp_size == 1 and config.tensor_parallel_size == 1
    assert options.watchdog_timeout == 300 and options.health_timeout == 20
    assert options.ttft_buckets == TTFT_BUCKETS and options.ttft_buckets[0] == 0.1
    assert config.block_size == 1 and config.enable_prefix_caching
    assert config.max_num_seqs == 4096  # sized from the KV cache: 400k tokens at 8192 context, at most 4096
    assert ignored == []


def test_every_modelled_flag_is_read() -> None:
    config, ignored = serve_config([
        "--engine", "sglang", "--model-path", "/models/llama", "--served-model-name", "llama",
        "--host", "0.0.0.0", "--port", "30001", "--max-running-requests", "48", "--enable-metrics",
        "--tp-size", "2", "--dp-size", "2", "--bucket-time-to-first-token", "0.05", "0.25", "1",
        "--watchdog-timeout", "60", "--log-level", "warning", "--trust-remote-code", "--attention-backend", "fa3",
        "--sim-profile", "tiny-cpu", "--fault-hang-after", "5"], {"SGLANG_HEALTH_CHECK_TIMEOUT": "3"})
    options = config.sglang
    assert options is not None
    assert config.model == "/models/llama" and config.names == ["llama"]
    assert (config.host, config.port, config.max_num_seqs, config.tensor_parallel_size) == ("0.0.0.0", 30001, 48, 2)
    assert options.enable_metrics and options.dp_size == 2 and options.watchdog_timeout == 60
    assert options.ttft_buckets == (0.05, 0.25, 1.0) and options.log_level == "warning"
    assert options.health_timeout == 3 and config.faults.hang_after == 5
    assert ignored == ["--trust-remote-code", "--attention-backend"]


def test_the_model_may_come_positionally_as_the_agent_passes_it() -> None:
    config, _ = serve_config(["tiny", "--host", "127.0.0.1", "--port", "9000", "--engine", "sglang",
                              "--enable-metrics", "--tp", "4"], {})
    assert config.sglang is not None and config.model == "tiny" and config.tensor_parallel_size == 4


def test_the_running_limit_is_sized_as_sglang_sizes_it() -> None:
    assert max_running_requests(None, 400_000, 8192) == 4096  # 25k estimated, kept within 2048..4096
    assert max_running_requests(None, 4096, 2048) == 2048  # and never above half the pool
    assert max_running_requests(None, 1000, 2048) == 500
    assert max_running_requests(64, 400_000, 8192) == 64
    assert max_running_requests(10_000, 4096, 2048) == 2048


def test_the_vllm_face_is_the_default_and_unchanged() -> None:
    plain, _ = serve_config(["m", "--max-num-seqs", "64"], {})
    named, _ = serve_config(["m", "--max-num-seqs", "64", "--engine", "vllm"], {})
    assert plain == named and plain.sglang is None and plain.port == 8000 and plain.max_num_seqs == 64
    _, ignored = serve_config(["m", "--max-running-requests", "8"], {})
    assert ignored == ["--max-running-requests"]  # an SGLang flag means nothing to the vLLM face


@pytest.mark.parametrize("argv", [["--engine", "sglang"], ["--engine", "sglang", "m", "--dp-size", "0"],
                                  ["--engine", "tgi", "m"],
                                  ["--engine", "sglang", "m", "--bucket-time-to-first-token", "soon"],
                                  ["--engine", "sglang", "m", "--watchdog-timeout", "0"]])
def test_bad_input_is_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        serve_config(argv, {})


def test_a_bad_health_check_timeout_is_refused() -> None:
    with pytest.raises(SystemExit):
        serve_config(["--engine", "sglang", "m"], {"SGLANG_HEALTH_CHECK_TIMEOUT": "soon"})
