"""Render /metrics text the way vLLM exposes it (0.33 names, or the pre-0.12 names), for parser tests."""

from __future__ import annotations

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REASONS = ("stop", "length", "abort", "error", "repetition")


def _labels(model: str, **extra: str) -> str:
    items = {"engine": "0", "model_name": model, **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(items.items())) + "}"


def _histogram(name: str, model: str, bounds: tuple[float, ...], observations: list[float]) -> list[str]:
    lines = [f"# HELP {name} Histogram of {name}.", f"# TYPE {name} histogram"]
    for le in (*bounds, float("inf")):
        count = sum(1 for o in observations if o <= le)
        label = "+Inf" if le == float("inf") else repr(float(le))
        lines.append(f"{name}_bucket{_labels(model, le=label)} {float(count)}")
    lines.append(f"{name}_count{_labels(model)} {float(len(observations))}")
    lines.append(f"{name}_sum{_labels(model)} {float(sum(observations))}")
    lines.append(f"{name}_created{_labels(model)} 1.7e+09")
    return lines


def render(model: str = "m", *, running: float = 0, waiting: float = 0, kv: float = 0.0,
           prompt_tokens: float = 0, generation_tokens: float = 0, preemptions: float = 0,
           success: dict[str, float] | None = None, ttft: list[float] | None = None,
           itl: list[float] | None = None, e2e: list[float] | None = None, old_names: bool = False) -> str:
    """One /metrics body. Histograms take the raw observations (cumulative since the engine started)."""
    kv_name = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
    itl_name = "vllm:time_per_output_token_seconds" if old_names else "vllm:inter_token_latency_seconds"
    prefix = "vllm:gpu_prefix_cache" if old_names else "vllm:prefix_cache"
    lines: list[str] = []

    def gauge(name: str, value: float) -> None:
        lines.extend([f"# HELP {name} {name}.", f"# TYPE {name} gauge", f"{name}{_labels(model)} {float(value)}"])

    def counter(name: str, value: float) -> None:
        lines.extend([f"# HELP {name}_total {name}.", f"# TYPE {name}_total counter",
                      f"{name}_total{_labels(model)} {float(value)}", f"{name}_created{_labels(model)} 1.7e+09"])

    gauge("vllm:num_requests_running", running)
    gauge("vllm:num_requests_waiting", waiting)
    gauge(kv_name, kv)
    counter(f"{prefix}_queries", 0)
    counter(f"{prefix}_hits", 0)
    counter("vllm:num_preemptions", preemptions)
    counter("vllm:prompt_tokens", prompt_tokens)
    counter("vllm:generation_tokens", generation_tokens)
    lines += ["# HELP vllm:request_success_total Count of successfully processed requests.",
              "# TYPE vllm:request_success_total counter"]
    for reason in REASONS:
        value = float((success or {}).get(reason, 0))
        lines.append(f"vllm:request_success_total{_labels(model, finished_reason=reason)} {value}")
    lines += _histogram("vllm:time_to_first_token_seconds", model, TTFT_BUCKETS, ttft or [])
    lines += _histogram(itl_name, model, ITL_BUCKETS, itl or [])
    lines += _histogram("vllm:e2e_request_latency_seconds", model, (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0),
                        e2e or [])
    return "\n".join(lines) + "\n"
