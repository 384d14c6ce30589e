"""Speed profiles: what one simulated GPU and model cost per engine step, and how much KV cache they hold.

A profile is plain data. ``step_seconds`` turns a step's shape (sequences in the batch, prefill tokens in it)
into wall time; ``kv_capacity_blocks`` sizes the KV cache the way vLLM does at start-up: the memory the
engine may use (total x ``--gpu-memory-utilization``) minus weights and activation headroom, divided by the
bytes one token's keys and values take, grouped into ``--block-size`` token blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class SpeedProfile:
    """Cost model and hardware facts of one model on one GPU."""

    name: str
    description: str
    gpu_name: str
    gpu_memory_bytes: int
    weights_bytes: int
    # Activations, CUDA graphs and the non-torch allocations vLLM's profiling run reserves.
    activation_bytes: int
    kv_bytes_per_token: int
    max_model_len: int
    step_base_s: float
    step_per_seq_s: float
    step_per_prefill_token_s: float
    # Cold start: the first steps after start-up run slower (allocator, kernel autotuning, lazy compilation);
    # the slowdown starts at warmup_factor and fades linearly to none over warmup_steps.
    warmup_steps: int
    warmup_factor: float
    # Length of a "natural" answer when the client lets the model stop on EOS.
    mean_output_tokens: int
    power_idle_watts: float
    # What the board would draw at full utilisation with no limit: above the limit on a GPU that power-caps under
    # full load (``gpufile.power_draw``).
    power_busy_watts: float
    power_limit_watts: float
    temperature_idle_celsius: float
    # The steady state under full load, reached in two lags (``gpufile.SimulatedGpu``): the die's, fast, for
    # ``temperature_die_share`` of the rise, and the heatsink's, slower, for the rest.
    temperature_busy_celsius: float
    slowdown_temperature_celsius: float
    shutdown_temperature_celsius: float
    # Utilisation of a step with n sequences in the batch: 1 - exp(-n / scale). One request leaves most of the
    # GPU idle (22 % at scale 4), a batch of 16 saturates it (98 %).
    utilization_batch_scale: float = 4.0
    temperature_die_share: float = 0.59
    die_time_constant_s: float = 0.3
    sink_time_constant_s: float = 10.0

    def utilization(self, num_seqs: int) -> float:
        """The share of the GPU one step keeps busy with ``num_seqs`` sequences in its batch."""
        if num_seqs <= 0:
            return 0.0
        return 1.0 - math.exp(-num_seqs / self.utilization_batch_scale)

    def step_seconds(self, num_seqs: int, prefill_tokens: int) -> float:
        """Wall time of one engine step: a fixed cost, a cost per sequence in the batch, a cost per prefill token."""
        if num_seqs <= 0:
            return 0.0
        return self.step_base_s + self.step_per_seq_s * num_seqs + self.step_per_prefill_token_s * prefill_tokens

    def warmup_multiplier(self, steps_done: int) -> float:
        """How much slower step number ``steps_done`` (from 0) runs than a warm one."""
        remaining = max(0.0, 1.0 - steps_done / self.warmup_steps) if self.warmup_steps > 0 else 0.0
        return 1.0 + (self.warmup_factor - 1.0) * remaining

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        """KV cache blocks available at the given memory share; never negative."""
        budget = self.gpu_memory_bytes * gpu_memory_utilization - self.weights_bytes - self.activation_bytes
        tokens = max(0, int(budget // self.kv_bytes_per_token))
        return tokens // block_size


# Llama-3.1-8B in bf16 on one H100 80GB: 16 GB of weights; 32 layers x 8 KV heads x 128 dims x 2 (K, V)
# x 2 bytes = 128 KiB per token, so ~400k tokens of KV at 0.9 utilisation. Decode ~10 ms at batch 1,
# ~24 ms at 64, ~66 ms at 256; prefill ~40k tokens/s. Power and heat as measured on an H200 (the same 700 W
# SXM board): 77 W and 35 degC idle; under a saturating bf16 matmul 691 W with sw_power_cap against the 700 W
# limit, 53 degC after 2 s and 58 degC after 10 s, back to 42 degC within 2 s of the load stopping. Read every
# 0.25 s through the agent's NVML backend on another H200 (37 degC idle): 52 degC 0.5 s into the load, 58 degC
# at 10 s; 43 degC 0.5 s after it stopped, 39 degC at 2 s, 38 degC at 20 s: a fast die over a slower heatsink.
H100_LLAMA_8B = SpeedProfile(
    name="llama-8b-h100",
    description="8B dense model, bf16, one H100 80GB",
    gpu_name="NVIDIA H100 80GB HBM3 (simulated)",
    gpu_memory_bytes=80 * GIB,
    weights_bytes=16 * GIB,
    activation_bytes=6 * GIB,
    kv_bytes_per_token=131072,
    max_model_len=8192,
    step_base_s=0.0095,
    step_per_seq_s=0.00022,
    step_per_prefill_token_s=0.000025,
    warmup_steps=100,
    warmup_factor=3.0,
    mean_output_tokens=200,
    power_idle_watts=77.0,
    power_busy_watts=760.0,
    power_limit_watts=700.0,
    temperature_idle_celsius=35.0,
    temperature_busy_celsius=62.0,
    slowdown_temperature_celsius=87.0,
    shutdown_temperature_celsius=92.0,
)

# A small model on a small card: quick steps and a KV cache of ~4k tokens, so preemption and the
# out-of-memory path are easy to reach in tests and demos.
TINY_CPU = SpeedProfile(
    name="tiny-cpu",
    description="tiny model with a small KV cache, fast steps; for tests and demos",
    gpu_name="Small GPU 2GB (simulated)",
    gpu_memory_bytes=2 * GIB,
    weights_bytes=GIB // 2,
    activation_bytes=GIB // 2,
    kv_bytes_per_token=(GIB * 8 // 10) // 4096,
    max_model_len=2048,
    step_base_s=0.004,
    step_per_seq_s=0.0002,
    step_per_prefill_token_s=0.000005,
    warmup_steps=60,
    warmup_factor=4.0,
    mean_output_tokens=32,
    power_idle_watts=60.0,
    power_busy_watts=300.0,
    power_limit_watts=350.0,
    temperature_idle_celsius=32.0,
    temperature_busy_celsius=60.0,
    slowdown_temperature_celsius=87.0,
    shutdown_temperature_celsius=92.0,
)

PROFILES: dict[str, SpeedProfile] = {p.name: p for p in (H100_LLAMA_8B, TINY_CPU)}
DEFAULT_PROFILE = H100_LLAMA_8B.name


def get_profile(name: str) -> SpeedProfile:
    """The profile called ``name``; ValueError naming the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose from {', '.join(PROFILES)}") from None
