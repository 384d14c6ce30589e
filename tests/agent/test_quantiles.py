"""Quantile estimation from cumulative buckets (PromQL's histogram_quantile rules)."""

from __future__ import annotations

import math

import pytest

from agent.quantiles import bucket_delta, quantile

INF = math.inf


def test_linear_interpolation_inside_the_bucket() -> None:
    buckets = {0.1: 50.0, 0.5: 90.0, 1.0: 100.0, INF: 100.0}
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.7, buckets) == pytest.approx(0.1 + 0.4 * (20 / 40))
    assert quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (9 / 10))
    assert quantile(0.25, buckets) == pytest.approx(0.05)


def test_rank_in_the_inf_bucket_returns_the_highest_finite_bound() -> None:
    assert quantile(0.99, {0.1: 1.0, 1.0: 1.0, INF: 10.0}) == 1.0


def test_nothing_observed_is_none() -> None:
    assert quantile(0.5, {0.1: 0.0, INF: 0.0}) is None
    assert quantile(0.5, {}) is None


def test_delta_subtracts_and_a_drop_means_restart() -> None:
    assert bucket_delta({0.1: 5.0, INF: 8.0}, {0.1: 2.0, INF: 3.0}) == {0.1: 3.0, INF: 5.0}
    assert bucket_delta({0.1: 1.0, INF: 1.0}, {0.1: 2.0, INF: 3.0}) == {0.1: 1.0, INF: 1.0}
    assert bucket_delta({0.1: 1.0, INF: 1.0}, None) == {0.1: 1.0, INF: 1.0}
