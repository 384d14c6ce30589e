from agent.wire import EngineSample, EngineWindow, ProcessSample, ReplicaState, ReplicaStatus, WindowHistogram
from controlplane.policy.engine_args import flags_key, get_int_flag, set_flag
from controlplane.policy.snapshot import NOT_SERIES, REPLICA_SAMPLE_FIELDS, sample_from_status
from tests.policy.series import at, replica


def test_flags_are_read_in_both_spellings_and_rewritten_once():
    assert get_int_flag(["--max-num-seqs", "64"], "--max-num-seqs") == 64
    assert get_int_flag(["--max-num-seqs=32", "--port", "8000"], "--max-num-seqs") == 32
    assert get_int_flag(["--max-num-seqs", "64", "--max-num-seqs=16"], "--max-num-seqs") == 16  # last wins
    assert get_int_flag(["--max-num-seqs"], "--max-num-seqs") is None
    assert set_flag(["--model", "m", "--max-num-seqs=64", "--max-num-seqs", "8", "--port", "1"], "--max-num-seqs",
                    "32") == ["--model", "m", "--port", "1", "--max-num-seqs", "32"]


def test_replica_knows_its_max_num_seqs():
    assert replica(args=["--max-num-seqs", "48"]).max_num_seqs == 48
    assert replica(args=[]).max_num_seqs is None


def test_history_samples_mirror_the_wire_field_names():
    # Every engine and process figure an agent reports has a home in the policy engine's samples, so the
    # store copies across without a mapping table. Fields that are not time series are listed here.
    wire = set(EngineSample.model_fields) - NOT_SERIES
    wire |= {"rss_bytes", "gpu_memory_bytes"} & set(ProcessSample.model_fields)
    assert wire <= REPLICA_SAMPLE_FIELDS


def test_sample_from_a_reported_status():
    status = ReplicaStatus(name="r1", model="m", url="http://127.0.0.1:8000", state=ReplicaState.READY, ready=True,
                           state_since=at(0), engine_args=["--max-num-seqs", "96"],
                           engine=EngineSample(ttft_p99_seconds=0.42, generation_tokens_total=1e6, window=EngineWindow(
                               ended_at=at(10), seconds=5.0, steps=40.0,
                               itl=WindowHistogram(bounds=[0.05, 0.1], counts=[30.0, 10.0, 0.0]))),
                           process=ProcessSample(rss_bytes=123, gpu_memory_bytes=456), canary_ok=False)
    sample = sample_from_status(at(10), status)
    assert (sample.ttft_p99_seconds, sample.generation_tokens_total) == (0.42, 1e6)
    assert (sample.rss_bytes, sample.gpu_memory_bytes, sample.canary_ok, sample.max_num_seqs) == (123, 456, False, 96)
    assert sample.generation == status.generation and sample.flags_key == flags_key([])
    # The window's histograms stay in the store's values for the canary judge, out of the history.
    from controlplane.fleet.ingest import replica_series_values
    from controlplane.remediation.history import replica_sample

    values = replica_series_values(status)
    assert values["window"]["itl"]["counts"] == [30.0, 10.0, 0.0] and values["window"]["steps"] == 40.0
    assert replica_sample(at(10), values).ttft_p99_seconds == 0.42


def test_a_wedged_replicas_lost_requests_reach_its_samples_through_the_store_and_directly():
    from controlplane.fleet.ingest import replica_series_values
    from controlplane.remediation.history import replica_sample

    status = ReplicaStatus(name="r1", model="m", url="http://127.0.0.1:8000", state=ReplicaState.WEDGED,
                           ready=False, state_since=at(0), canary_ok=False, requests_in_flight_at_wedge=3)
    assert sample_from_status(at(10), status).requests_lost == 3
    assert replica_sample(at(10), replica_series_values(status)).requests_lost == 3
    # Left off the wire while unset: a control plane that predates the field reads every other report as before.
    ready = status.model_copy(update={"state": ReplicaState.READY, "requests_in_flight_at_wedge": None})
    assert "requests_in_flight_at_wedge" not in ready.model_dump()
