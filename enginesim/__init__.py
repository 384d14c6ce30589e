"""A vLLM 0.33-compatible engine simulator: the same HTTP API, SSE streams and /metrics, no GPU needed.

``pitstop sim serve MODEL [vllm serve flags]`` starts one (``enginesim.cli``); ``pitstop sim load URL...``
drives it. Modules, one concept each: ``profiles`` (speed and memory model), ``scheduler`` (continuous
batching, pure), ``engine`` (the step loop on an injected clock), ``metrics`` (the metric table),
``protocol`` (OpenAI request/response shapes), ``api`` (Starlette routes), ``gpufile`` (simulated GPU readings
for the agent, with their file contract), ``faults`` (fault settings, real RSS leak), ``server`` (process
life: cold start, signals, faults), ``loadgen`` and ``virtual_load`` (load over HTTP and on a virtual clock).
"""
