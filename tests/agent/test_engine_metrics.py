"""Reading vLLM /metrics: both name generations, rates over the window, counter resets, garbage."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.engine_metrics import MetricsParseError, engine_sample, parse_metrics
from agent.wire import EngineSample, WindowHistogram
from tests.agent.vllm_text import render

FIXTURES = Path(__file__).parent / "fixtures"


def test_reads_a_vllm_033_scrape() -> None:
    # Recorded from the simulator's /metrics after six streamed requests of 20 tokens.
    snap = parse_metrics((FIXTURES / "vllm-0.33-metrics.txt").read_text(), at=0.0, model="tiny")
    assert snap.values["generation_tokens"] == 120
    assert snap.values["prompt_tokens"] == 6
    assert snap.values["requests"] == 6
    assert snap.values["errors"] == 0
    assert snap.values["running"] == 0 and snap.values["kv_usage"] == 0
    assert snap.histograms["ttft"][float("inf")] == 6
    assert snap.histograms["itl"][float("inf")] == 114


def test_reads_pre_012_names() -> None:
    snap = parse_metrics((FIXTURES / "vllm-0.11-metrics.txt").read_text(), at=0.0)
    assert snap.values["kv_usage"] == pytest.approx(0.42)
    assert snap.values["running"] == 3 and snap.values["waiting"] == 1
    assert snap.values["errors"] == 1
    assert snap.values["prefix_queries"] == 0
    assert snap.histograms["itl"][float("inf")] == 400  # time_per_output_token_seconds


def test_other_models_series_are_ignored() -> None:
    text = render("a", generation_tokens=10) + render("b", generation_tokens=99).replace("# ", "#x ")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("#x"))
    assert parse_metrics(text, 0.0, model="a").values["generation_tokens"] == 10


def test_rates_come_from_the_difference_of_two_scrapes() -> None:
    before = parse_metrics(render(generation_tokens=1000, prompt_tokens=100, success={"stop": 10}), at=100.0)
    after = parse_metrics(render(generation_tokens=1500, prompt_tokens=300, running=4, waiting=2, kv=0.5,
                                 success={"stop": 18, "error": 1, "abort": 1}), at=110.0)
    sample = engine_sample(after, before)
    assert sample.generation_tokens_per_second == pytest.approx(50.0)
    assert sample.prompt_tokens_per_second == pytest.approx(20.0)
    assert sample.requests_per_second == pytest.approx(1.0)
    assert sample.errors_per_second == pytest.approx(0.2)
    assert (sample.requests_running, sample.requests_waiting, sample.kv_cache_usage_ratio) == (4, 2, 0.5)
    assert sample.generation_tokens_total == 1500


def test_preemptions_are_a_rate_too_and_travel_only_when_there_are_some() -> None:
    before = parse_metrics(render(preemptions=40), at=100.0)
    after = parse_metrics(render(preemptions=70, kv=0.99), at=110.0)
    sample = engine_sample(after, before)
    assert sample.preemptions_per_second == pytest.approx(3.0) and sample.preemptions_total == 70
    assert sample.model_dump()["preemptions_per_second"] == pytest.approx(3.0)
    # None preempted: left off the wire, so a control plane that predates the field still reads the report.
    quiet = engine_sample(parse_metrics(render(preemptions=70), at=120.0), after)
    assert quiet.preemptions_per_second == 0.0 and "preemptions_per_second" not in quiet.model_dump()
    # What the control plane reads back: zero, not "unknown" (a rate of sporadic preemptions must not look
    # like a preemption in every reading); the first scrape has no rates at all.
    read_back = type(quiet).model_validate(quiet.model_dump())
    assert read_back.preemption_rate() == 0.0 and after.values and engine_sample(after, None).preemption_rate() is None


def test_first_scrape_has_gauges_but_no_rates() -> None:
    sample = engine_sample(parse_metrics(render(running=2, generation_tokens=10, ttft=[0.1]), at=1.0), None)
    assert sample.requests_running == 2
    assert sample.generation_tokens_per_second is None and sample.ttft_p99_seconds is None


def test_counter_reset_never_gives_a_negative_rate() -> None:
    # The engine restarted between scrapes: its counters start again from zero.
    before = parse_metrics(render(generation_tokens=90_000, success={"stop": 500}, ttft=[0.05] * 500), at=0.0)
    after = parse_metrics(render(generation_tokens=200, success={"stop": 2}, ttft=[2.0, 2.0]), at=10.0)
    sample = engine_sample(after, before)
    assert sample.generation_tokens_per_second == pytest.approx(20.0)
    assert sample.requests_per_second == pytest.approx(0.2)
    # The window after a reset is what the new engine observed, not a negative bucket delta.
    assert sample.ttft_p50_seconds is not None and 1.0 < sample.ttft_p50_seconds <= 2.5


def test_window_quantiles_ignore_lifetime_history() -> None:
    history = [0.05] * 10_000  # hours of fast first tokens
    before = parse_metrics(render(ttft=history, itl=[0.02] * 1000), at=0.0)
    after = parse_metrics(render(ttft=history + [3.0] * 100, itl=[0.02] * 1000 + [0.3] * 100), at=5.0)
    sample = engine_sample(after, before)
    # Lifetime p99 would still read ~0.05 s; the window shows the regression.
    assert sample.ttft_p50_seconds is not None and 2.5 < sample.ttft_p50_seconds <= 5.0
    assert sample.itl_p99_seconds is not None and 0.2 < sample.itl_p99_seconds <= 0.3


def test_a_window_carries_its_latency_histograms_and_engine_steps_as_recorded_from_vllm() -> None:
    # Two scrapes of the CPU build 0.32 before and after a few requests.
    recorded = Path(__file__).parents[1] / "fixtures" / "vllm-0.32.0-cpu"
    cold = parse_metrics((recorded / "metrics-cold.txt").read_text(), at=0.0)
    warm = parse_metrics((recorded / "metrics-warm.txt").read_text(), at=10.0)
    ended = datetime(2026, 12, 1, 12, tzinfo=UTC)
    window = engine_sample(warm, cold, ended_at=ended).window
    assert window is not None and window.ended_at == ended and window.seconds == 10.0
    # Its steps are vllm:iteration_tokens_total's count; its counts are per bucket, the last above every bound.
    assert window.steps == 95.0
    assert window.itl is not None and window.itl.bounds[:3] == [0.01, 0.025, 0.05] and window.itl.total == 87.0
    assert window.ttft is not None and len(window.ttft.counts) == len(window.ttft.bounds) + 1
    assert window.ttft.total == 8.0
    # No wall clock, or a first scrape: no window (the control plane could not tell one from the next).
    assert engine_sample(warm, cold).window is None and engine_sample(warm, None, ended_at=ended).window is None
    # An idle window has steps but no latency histograms.
    idle = engine_sample(parse_metrics((recorded / "metrics-warm.txt").read_text(), at=15.0), warm, ended_at=ended)
    assert idle.window is not None and idle.window.itl is None and idle.window.steps == 0.0


def test_a_window_histogram_with_the_wrong_shape_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match="need one more than bounds"):
        WindowHistogram(bounds=[0.1, 0.2], counts=[1.0, 2.0])
    with pytest.raises(ValidationError, match="bounds must increase"):
        WindowHistogram(bounds=[0.2, 0.1], counts=[1.0, 2.0, 0.0])


@pytest.mark.parametrize("text", ["<html>502 Bad Gateway</html>", "vllm:x{{{ 1\n", "", "# only comments\n",
                                  "go_goroutines 12\n"])
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics(text, 0.0)


def rank(text: str, engine: int) -> str:
    """A body as rank ``engine`` of a data-parallel vLLM sends its series (label ``engine``)."""
    return text.replace('engine="0"', f'engine="{engine}"')


def test_the_ranks_of_a_data_parallel_engine_are_summed() -> None:
    text = render(running=3, waiting=1, kv=0.5, generation_tokens=10, ttft=[0.05]) + rank(
        render(running=2, kv=0.7, generation_tokens=20, ttft=[0.05, 0.3]), 1)
    snap = parse_metrics(text, 0.0, model="m")
    assert (snap.values["running"], snap.values["waiting"], snap.values["generation_tokens"]) == (5, 1, 30)
    assert snap.values["kv_usage"] == 0.7  # the fullest rank's cache, not a sum
    assert snap.histograms["ttft"][float("inf")] == 3


def test_a_series_sent_twice_is_an_error_never_a_sum() -> None:
    line = 'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
    for text in (render(running=3) + line,  # once more
                 render(running=3) + line * 100_000,  # an engine repeating itself without end
                 render() + 'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'):  # labels reordered
        with pytest.raises(MetricsParseError) as err:
            parse_metrics(text, 0.0, model="m")
        assert str(err.value).startswith("engine /metrics refused: duplicate series vllm:num_requests_running{")
        assert "the same name and labels twice in one body" in str(err.value)


def running_ranks(count: int) -> str:
    return "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1\n' for i in range(count))


def test_more_wanted_samples_than_any_engine_sends_is_an_error() -> None:
    with pytest.raises(MetricsParseError, match="more than 10000 samples of the series read"):
        parse_metrics(running_ranks(10_001), 0.0, model="m")
    # Up to the bound, distinct series are an engine's ranks, summed; unwanted lines do not count.
    noise = "".join(f'vllm:other_gauge{{i="{i}"}} 1\n' for i in range(20_000))
    assert parse_metrics(noise + running_ranks(10_000), 0.0, "m").values["running"] == 10_000


def test_an_engine_printing_nan_inf_or_negative_numbers_gives_unknowns_not_a_refused_report() -> None:
    # Every float here is one the control plane refuses (the wire is finite and non-negative): sent as it is,
    # it would cost the node its whole report; raised, the agent's collector.
    before = parse_metrics(render(generation_tokens=1000, ttft=[0.1, 0.2]), at=100.0)
    text = render(running=-3, waiting=float("nan"), kv=1.7, generation_tokens=400, ttft=[0.1, 0.2, 0.3])
    text = text.replace('vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0',
                        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} +Inf')
    sample = engine_sample(parse_metrics(text, at=110.0), before)
    assert (sample.requests_running, sample.requests_waiting, sample.kv_cache_usage_ratio) == (None, None, None)
    assert sample.generation_tokens_total == 400  # what is a reading stays one
    EngineSample.model_validate(sample.model_dump())  # and the whole sample is one the wire accepts


def test_a_body_of_a_shape_read_before_gives_its_new_values_and_a_new_shape_is_read_afresh() -> None:
    # An engine sends the same series every scrape: the second body reuses what the first one's lines were.
    first = parse_metrics(render(generation_tokens=10, success={"stop": 2}, ttft=[0.03]), 0.0)
    again = parse_metrics(render(generation_tokens=17, success={"stop": 3}, ttft=[0.03, 0.3]), 1.0)
    assert (first.values["generation_tokens"], again.values["generation_tokens"]) == (10, 17)
    assert (first.values["requests"], again.values["requests"]) == (2, 3)
    assert (first.histograms["ttft"][0.04], again.histograms["ttft"][0.04]) == (1, 1)
    assert again.histograms["ttft"][float("inf")] == 2
    # A finished reason that appears for the first time is a new series, hence a new shape: counted.
    errored = parse_metrics(render(generation_tokens=17, success={"stop": 3, "error": 2}), 2.0)
    assert (errored.values["requests"], errored.values["errors"]) == (5, 2)
    # The same shape read for another model picks that model's lines only.
    assert parse_metrics(render("m", generation_tokens=5), 3.0, model="other").values["generation_tokens"] == 0


def test_a_line_only_the_exact_parser_reads_gives_the_same_figures() -> None:
    text = render(generation_tokens=42, running=3, success={"stop": 7, "abort": 1}, itl=[0.02, 0.2])
    # A float timestamp on every sample: the fast form leaves those lines to the exact parser.
    stamped = "\n".join(line if line.startswith("#") or not line else f"{line} 1700000000.5"
                        for line in text.splitlines())
    fast, exact = parse_metrics(text, 0.0), parse_metrics(stamped, 0.0)
    assert exact.values == fast.values and exact.histograms == fast.histograms
    assert exact.values["errors"] == 1 and exact.values["running"] == 3


def test_a_bad_value_in_a_body_of_a_known_shape_is_still_an_error_naming_the_line() -> None:
    parse_metrics(render(generation_tokens=1), 0.0)
    line = 'vllm:generation_tokens_total{engine="0",model_name="m"} 1.0'
    broken = render(generation_tokens=1).replace(line, line + ".0")
    assert broken != render(generation_tokens=1)
    with pytest.raises(MetricsParseError, match="generation_tokens_total"):
        parse_metrics(broken, 1.0)
