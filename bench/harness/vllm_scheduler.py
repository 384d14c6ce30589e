"""vLLM's real scheduler built as its engine core builds it, stepped with made-up model outputs.

For vLLM's own Python only (``.pitstop/vllm-venv``): the live-cap plug-in's checks
(``tests/live_cap/scheduler_checks.py``) and its cost per step (``bench/live_cap_cost.py``). A tiny Llama's
config, a KV cache of ``num_blocks`` blocks of 16 tokens, no model: each step samples one token (7) for every
scheduled request, so a step costs the scheduler's own work and nothing else.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / ".pitstop" / "tiny-llama"
PLUGIN_DIR = REPO / "agent" / "live_cap"
sys.path.insert(0, str(PLUGIN_DIR))

import pitstop_live_cap as plugin  # noqa: E402


def build(*, max_num_seqs: int, async_scheduling: bool = False, num_blocks: int = 64, cap_file: Path | None,
          plain: bool = False) -> Any:
    """The plug-in's scheduler reading ``cap_file`` (vLLM's own ``Scheduler`` with ``plain``)."""
    if cap_file is not None:
        os.environ[plugin.ENV_FILE] = str(cap_file)
    model = ModelConfig(model=str(MODEL_DIR), max_model_len=256, dtype="float32", skip_tokenizer_init=True)
    config = VllmConfig(model_config=model, cache_config=CacheConfig(block_size=16, enable_prefix_caching=False),
                        scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=4096,
                                                         max_model_len=256, is_encoder_decoder=False,
                                                         async_scheduling=async_scheduling))
    config.cache_config.num_gpu_blocks = num_blocks
    # The CPU platform turns asynchronous scheduling off; a GPU engine has it on unless something rules it out.
    # The plug-in reads the decision as the engine core does, from the finished config.
    config.scheduler_config.async_scheduling = async_scheduling
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["model.layers.0.self_attn"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=16,
                                                        dtype=torch.float32))])
    kind = Scheduler if plain else plugin.LiveCapScheduler
    return kind(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
                block_size=16)


def add(scheduler: Any, name: str, tokens: int = 50) -> None:
    scheduler.add_request(Request(name, [1, 2, 3, 4], SamplingParams(max_tokens=tokens, ignore_eos=True), None))


def step(scheduler: Any) -> tuple[list[str], list[str]]:
    """One step: the ids given a token, and the ids that finished."""
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    result = scheduler.update_from_output(out, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=[[7] for _ in ids]))
    finished = [o.request_id for outputs in result.values() for o in outputs.outputs if o.finish_reason is not None]
    return sorted(ids), finished
