"""The agent's selective /metrics reader agrees with prometheus_client's parser on real vLLM output."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.engine_metrics import engine_sample, parse_metrics, wanted_names
from agent.prom_lines import PromTextError, SampleSelector, SeriesError, parse_line, select_samples
from engines import VLLM

WANTED_NAMES = wanted_names(VLLM)

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu"
RECORDED = [REAL / "metrics-warm.txt", REAL / "metrics-cold.txt",
            Path(__file__).parent / "fixtures" / "vllm-0.33-metrics.txt",
            Path(__file__).parent / "fixtures" / "vllm-0.11-metrics.txt"]


def reference(text: str, names: frozenset[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.name)
def test_same_samples_as_prometheus_client(path: Path) -> None:
    text = path.read_text()
    mine = select_samples(text, WANTED_NAMES)
    assert mine == reference(text, WANTED_NAMES)
    assert sum(len(rows) for rows in mine.values()) > 20


def test_real_warm_scrape_reads_the_served_requests() -> None:
    warm = parse_metrics((REAL / "metrics-warm.txt").read_text(), 0.0, "tiny")
    assert warm.values["requests"] == 8  # the README: recorded after 8 requests
    assert warm.values["generation_tokens"] > 0
    assert warm.histograms["ttft"][math.inf] == 8


def test_real_restart_is_a_counter_reset_without_negative_rates() -> None:
    warm = parse_metrics((REAL / "metrics-warm.txt").read_text(), 10.0, "tiny")
    cold = parse_metrics((REAL / "metrics-cold.txt").read_text(), 15.0, "tiny")
    sample = engine_sample(cold, warm)
    assert sample.generation_tokens_per_second == 0
    assert sample.requests_per_second == 0
    assert sample.ttft_p50_seconds is None  # nothing observed in the window


@pytest.mark.parametrize(("line", "expected"), [
    ('a_total{x="1",y="q\\"uote"} 3', ("a_total", {"x": "1", "y": 'q"uote'}, 3.0)),
    ('b{le="+Inf"} 7.0 1700000000000', ("b", {"le": "+Inf"}, 7.0)),
    ('c{path="/a}b",} +Inf', ("c", {"path": "/a}b"}, math.inf)),
    ("d 1e-3", ("d", {}, 0.001)),
])
def test_parses_the_text_format(line: str, expected: tuple[str, dict[str, str], float]) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize("line", ['a{x="1" 2', "a{x=1} 2", "a{} x", "a", 'a{x="1"} 1 2 3'])
def test_a_broken_wanted_line_is_an_error(line: str) -> None:
    with pytest.raises(PromTextError):
        select_samples(line + "\n", {"a"})


def test_unwanted_lines_are_not_even_parsed() -> None:
    assert select_samples('junk{{{ 1\nvllm:a 2\nvllm:ab{ 3\n', {"vllm:a"}) == {"vllm:a": [({}, 2.0)]}


def test_cached_label_blocks_give_the_same_samples_with_new_values() -> None:
    selector = SampleSelector({"x_bucket"})
    first = selector.select('x_bucket{le="0.5",model_name="m"} 1\nx_bucket{le="+Inf",model_name="m"} 2\n')
    second = selector.select('x_bucket{le="0.5",model_name="m"} 5\nx_bucket{le="+Inf",model_name="m"} 9 17\n')
    assert first == {"x_bucket": [({"le": "0.5", "model_name": "m"}, 1.0), ({"le": "+Inf", "model_name": "m"}, 2.0)]}
    assert second == {"x_bucket": [({"le": "0.5", "model_name": "m"}, 5.0), ({"le": "+Inf", "model_name": "m"}, 9.0)]}
    with pytest.raises(PromTextError):
        selector.select('x_bucket{le="0.5",model_name="m"} five\n')


def test_a_float_timestamp_takes_the_exact_path_and_keeps_every_sample() -> None:
    text = 'vllm:a{x="1"} 3 1.7e12\nvllm:a{x="2"} 4\n'
    assert select_samples(text, {"vllm:a"}) == {"vllm:a": [({"x": "1"}, 3.0), ({"x": "2"}, 4.0)]}


@pytest.mark.parametrize("timestamp", ["", " 1.7e12"], ids=["fast", "exact"])  # a float timestamp: the exact path
def test_a_series_sent_twice_is_refused_on_either_path(timestamp: str) -> None:
    again = f'vllm:a{{x="1",y="2"}} 1{timestamp}\nvllm:a{{y="2",x="1"}} 2{timestamp}\n'  # labels in another order
    with pytest.raises(SeriesError, match=r'^duplicate series vllm:a\{y="2",x="1"\}: the same name and labels'):
        select_samples(again, {"vllm:a"})
    other_name = f'vllm:a{{x="1"}} 1{timestamp}\nvllm:b{{x="1"}} 2{timestamp}\nvllm:a 3\n'
    assert select_samples(other_name, {"vllm:a", "vllm:b"}) == {
        "vllm:a": [({"x": "1"}, 1.0), ({}, 3.0)], "vllm:b": [({"x": "1"}, 2.0)]}


def test_wanted_samples_past_the_bound_are_refused_without_reading_the_rest() -> None:
    selector = SampleSelector({"vllm:a"}, max_samples=5)
    lines = [f'vllm:a{{i="{i}"}} 1\n' for i in range(6)]
    assert len(selector.select("vllm:other 1\n" * 50 + "".join(lines[:5]))["vllm:a"]) == 5  # only wanted lines count
    with pytest.raises(SeriesError, match="more than 5 samples"):
        selector.select("".join(lines) + "vllm:a{broken 1\n" * 1000)  # past the bound: never parsed
    with pytest.raises(SeriesError, match="duplicate series"):  # a repeat among the first five is named instead
        selector.select("".join(lines[:2]) + lines[0] * 1000)
