"""Fixtures of the notifier tests: real control-plane processes (kill -9 included)."""

from tests.integration.conftest import processes

__all__ = ["processes"]
