from agent.wire import EngineSample, EngineWindow, ProcessSample, ReplicaState, ReplicaStatus, WindowHistogram
from controlplane.policy.engine_args import flags_key, get_int_flag, set_flag
from controlplane.policy.signals import from_stored, sample_from_status, stored_values
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
    # The window's histograms are read back for the canary judge, and left out of the leader's history cache.
    assert sample.window is not None and sample.window.itl is not None and sample.window.steps == 40.0
    assert sample.window.itl.counts == [30.0, 10.0, 0.0]
    cached = from_stored(at(10), stored_values(status))
    assert cached.ttft_p99_seconds == 0.42 and cached.window is None


def test_a_wedged_replicas_lost_requests_reach_its_samples_through_the_store_and_directly():
    status = ReplicaStatus(name="r1", model="m", url="http://127.0.0.1:8000", state=ReplicaState.WEDGED,
                           ready=False, state_since=at(0), canary_ok=False, requests_in_flight_at_wedge=3)
    assert sample_from_status(at(10), status).requests_lost == 3
    assert from_stored(at(10), stored_values(status)).requests_lost == 3
    # Left off the wire while unset: a control plane that predates the field reads every other report as before.
    ready = status.model_copy(update={"state": ReplicaState.READY, "requests_in_flight_at_wedge": None})
    assert "requests_in_flight_at_wedge" not in ready.model_dump()
