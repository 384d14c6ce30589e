"""Command-line parsing: vLLM flags, tolerated unknown flags, fault flags over environment variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginesim.cli import serve_config, split_unknown
from enginesim.faults import FaultConfig, resolve_faults


def test_vllm_flags_and_defaults() -> None:
    config, ignored = serve_config(["meta-llama/Llama-3.1-8B", "--served-model-name", "a", "b",
                                    "--max-num-seqs", "64", "--no-enable-prefix-caching"], {})
    assert config.host == "127.0.0.1" and config.port == 8000  # loopback by default, unlike vLLM
    assert config.names == ["a", "b"] and config.max_num_seqs == 64
    assert config.model_len == 8192 and config.max_num_batched_tokens == 8192 and config.block_size == 16
    assert not config.enable_prefix_caching and config.shutdown_timeout == 0
    assert config.gpu_dir == Path(".pitstop/simgpu") and config.gpu_indices == [0]
    assert ignored == []


def test_unknown_flags_are_collected_with_their_values() -> None:
    config, ignored = serve_config(["m", "--trust-remote-code", "--pipeline-parallel-size", "2", "--dtype=half",
                                    "--port", "9001", "--kv-cache-dtype", "fp8"], {})
    assert ignored == ["--trust-remote-code", "--pipeline-parallel-size", "--dtype", "--kv-cache-dtype"]
    assert config.port == 9001 and config.model == "m"
    assert split_unknown(["--a", "1", "--b=2", "stray"]) == (["--a", "--b"], ["stray"])


def test_environment_configures_gpu_dir_and_indices() -> None:
    config, _ = serve_config(["m"], {"PITSTOP_SIM_GPU_DIR": "/tmp/g", "CUDA_VISIBLE_DEVICES": "1,3"})
    assert config.gpu_dir == Path("/tmp/g") and config.gpu_indices == [1, 3]


def test_keep_alive_is_read_from_the_environment_as_vllm_reads_it() -> None:
    assert serve_config(["m"], {})[0].keep_alive == 5
    assert serve_config(["m"], {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "15"})[0].keep_alive == 15
    with pytest.raises(SystemExit):
        serve_config(["m"], {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "soon"})


def test_fault_flags_win_over_environment() -> None:
    env = {"PITSTOP_SIM_FAULT_LEAK_RSS_MB_PER_MIN": "20", "PITSTOP_SIM_FAULT_FAIL_START": "1",
           "PITSTOP_SIM_FAULT_ERROR_RATE": "0.5", "PITSTOP_SIM_FAULT_XID_CODE": "48"}
    faults = resolve_faults({"error_rate": 0.1, "hang_after": 30.0}, env)
    assert faults == FaultConfig(leak_rss_mb_per_min=20.0, fail_start=True, error_rate=0.1, hang_after=30.0,
                                 xid_code="48")
    config, _ = serve_config(["m", "--fault-crash-after", "5"], {"PITSTOP_SIM_FAULT_CRASH_AFTER": "99"})
    assert config.faults.crash_after == 5.0


def test_bad_error_rate_is_refused() -> None:
    with pytest.raises(SystemExit):
        serve_config(["m", "--fault-error-rate", "1.5"], {})


def test_hang_gauges_flag_and_environment() -> None:
    assert serve_config(["m"], {})[0].faults.hang_gauges == "zero"  # what vLLM 0.32 showed (vllm#39863)
    config, _ = serve_config(["m", "--fault-hang-after", "3", "--fault-hang-gauges", "last"], {})
    assert config.faults.hang_after == 3.0 and config.faults.hang_gauges == "last"
    env = {"PITSTOP_SIM_FAULT_HANG_GAUGES": " Last "}
    assert serve_config(["m"], env)[0].faults.hang_gauges == "last"
    assert serve_config(["m", "--fault-hang-gauges", "zero"], env)[0].faults.hang_gauges == "zero"  # flag wins


def test_bad_hang_gauges_are_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"hang gauges must be one of zero, last, got 'frozen'"):
        resolve_faults({}, {"PITSTOP_SIM_FAULT_HANG_GAUGES": "frozen"})
    with pytest.raises(ValueError, match="zero, last"):
        FaultConfig(hang_gauges="frozen")  # type: ignore[arg-type]
    with pytest.raises(SystemExit):
        serve_config(["m"], {"PITSTOP_SIM_FAULT_HANG_GAUGES": "frozen"})
    with pytest.raises(SystemExit):
        serve_config(["m", "--fault-hang-gauges", "frozen"], {})
