"""vLLM reference data shipped with the simulator (vllm-metrics.tsv: vLLM 0.33 metric families)."""
