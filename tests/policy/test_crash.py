from agent.wire import ReplicaState
from controlplane.policy.conditions import CrashLoopCondition, OomCrashCondition
from controlplane.policy.detectors.crash import detect_crash_loop, detect_oom_crash
from tests.policy.series import at, replica

OOM_TAIL = [
    "INFO Loading weights took 3.2 s",
    "ERROR EngineCore failed to start.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139 GiB",
]


def test_fatal_replica_is_a_crash_loop_with_its_log_as_evidence():
    r = replica(state=ReplicaState.FATAL, restarts_total=5, last_exit_code=1, log_tail=["boom"],
                state_since=at(100))
    finding = detect_crash_loop(CrashLoopCondition(detector="crash_loop"), r, at(200))
    assert finding is not None and "5 restarts" in finding.summary
    assert finding.evidence[0].values["log_tail"] == ["boom"]


def test_backoff_is_not_yet_a_crash_loop():
    r = replica(state=ReplicaState.BACKOFF, restarts_total=2, last_exit_code=1)
    assert detect_crash_loop(CrashLoopCondition(detector="crash_loop"), r, at(0)) is None


def test_oom_crash_is_read_from_the_log_even_with_exit_code_zero():
    # vLLM's API server may exit 0 when its engine dies (docs/design.md, vLLM facts).
    r = replica(state=ReplicaState.BACKOFF, last_exit_code=0, log_tail=OOM_TAIL)
    finding = detect_oom_crash(OomCrashCondition(detector="oom_crash"), r, at(0))
    assert finding is not None and "CUDA out of memory" in finding.summary


def test_other_crashes_are_not_oom():
    r = replica(state=ReplicaState.BACKOFF, last_exit_code=1, log_tail=["ValueError: bad model path"])
    assert detect_oom_crash(OomCrashCondition(detector="oom_crash"), r, at(0)) is None


def test_a_replica_serving_again_is_no_longer_an_oom_crash():
    r = replica(state=ReplicaState.READY, last_exit_code=0, log_tail=OOM_TAIL)
    assert detect_oom_crash(OomCrashCondition(detector="oom_crash"), r, at(0)) is None
