"""Shared pieces of the benchmarks: real processes, the stock Prometheus pipeline, HAProxy, the fleet, figures.

The benchmark scripts import it as ``bench.harness``; so may tests that need the same real parts.
"""
