"""What --max-num-seqs does to the simulated engine under one heavy load level.

Default: the engine's timing model on a virtual clock (seconds of CPU for minutes of traffic, no host noise):
128 concurrent streams, 256-token prompts, 128-token outputs, 60 s, at --max-num-seqs 8, 64 and 256, once with
the default memory share and once with a tight one (--gpu-memory-utilization 0.3) so the KV cache overflows.
``--http`` instead starts real ``pitstop sim serve`` processes and drives them with ``pitstop sim load``
(client-measured; on a small host the client and server compete for CPU, which inflates the latencies).

    python bench/sim_max_num_seqs.py [--http] [--duration S] [--concurrency N]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.http import probe
from bench.harness.ports import free_port
from enginesim.loadgen import LoadSpec, run_load
from enginesim.profiles import H100_LLAMA_8B
from enginesim.virtual_load import run_virtual_load

SEQS = (8, 64, 256)
HEADER = (f"{'max_num_seqs':>12} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} "
          f"{'queue avg':>9} {'preempt':>8}")


def row(seqs: int, tps: float, ttft50: float, ttft99: float, itl50: float, itl99: float, queue: float,
        preempt: float) -> str:
    ms = 1000.0
    return (f"{seqs:>12} {tps:>9.0f} {ttft50 * ms:>7.0f}ms {ttft99 * ms:>7.0f}ms {itl50 * ms:>6.1f}ms "
            f"{itl99 * ms:>6.1f}ms {queue * ms:>7.0f}ms {preempt:>8.0f}")


def virtual(args: argparse.Namespace) -> None:
    for util in (0.9, 0.3):
        blocks = H100_LLAMA_8B.kv_capacity_blocks(util, 16)
        print(f"\nprofile {H100_LLAMA_8B.name}, --gpu-memory-utilization {util} ({blocks * 16} KV tokens), "
              f"{args.concurrency} streams x {args.prompt_tokens}+{args.max_tokens} tokens, "
              f"{args.duration:g} s (virtual clock)")
        print(HEADER)
        for seqs in SEQS:
            r = run_virtual_load(H100_LLAMA_8B, max_num_seqs=seqs, concurrency=args.concurrency,
                                 prompt_tokens=args.prompt_tokens, output_tokens=args.max_tokens,
                                 duration=args.duration, gpu_memory_utilization=util)
            print(row(seqs, r.tokens_per_s, r.ttft_p50, r.ttft_p99, r.itl_p50, r.itl_p99, r.queue_time_mean,
                      r.preemptions))


def _scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(probe.get(url + "/metrics").text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def http(args: argparse.Namespace) -> None:
    print(f"\nprofile {H100_LLAMA_8B.name}, real processes over HTTP, {args.concurrency} streams x "
          f"{args.prompt_tokens}+{args.max_tokens} tokens, {args.duration:g} s (client-measured)")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="simgpu-") as gpu_dir:
        for seqs in SEQS:
            _http_row(args, seqs, Path(gpu_dir))


def _http_row(args: argparse.Namespace, seqs: int, gpu_dir: Path) -> None:
    """Start one simulator at ``seqs``, warm it, load it, print its row, stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "sim", "serve", "bench-model", "--port",
                             str(port), "--max-num-seqs", str(seqs), "--sim-startup-seconds", "0",
                             "--sim-gpu-dir", str(gpu_dir)],
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if probe.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        warm = LoadSpec(urls=[url], concurrency=8, duration=3, prompt_tokens=args.prompt_tokens,
                        max_tokens=16, drain_grace=5)
        asyncio.run(run_load(warm))  # past the cold start, which is not what this measures
        before = _scrape(url)
        spec = LoadSpec(urls=[url], concurrency=args.concurrency, duration=args.duration,
                        prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, drain_grace=0)
        s = asyncio.run(run_load(spec))
        delta = {k: v - before.get(k, 0.0) for k, v in _scrape(url).items()}
        queue = delta["vllm:request_queue_time_seconds_sum"] / max(
            1.0, delta["vllm:request_queue_time_seconds_count"])
        print(row(seqs, s["tokens_per_s"], (s["ttft_ms_p50"] or 0) / 1e3, (s["ttft_ms_p99"] or 0) / 1e3,
                  (s["itl_ms_p50"] or 0) / 1e3, (s["itl_ms_p99"] or 0) / 1e3, queue,
                  delta["vllm:num_preemptions_total"]))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--http", action="store_true", help="real simulator processes and the HTTP load generator")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=128)
    args = p.parse_args()
    (http if args.http else virtual)(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
