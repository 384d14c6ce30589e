"""Detectors: pure functions over a replica's or a GPU's history that return a finding with its evidence."""

from controlplane.policy.detectors.findings import Evidence, Finding

__all__ = ["Evidence", "Finding"]
