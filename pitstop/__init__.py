"""Pitstop: observability and SRE control plane for vLLM fleets."""

__version__ = "0.1.0"
