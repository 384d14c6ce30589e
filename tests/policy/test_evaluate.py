"""evaluate() end to end: the shipped default policies over one fleet snapshot with several problems."""

from agent.wire import ReplicaState
from controlplane.policy.evaluate import evaluate
from controlplane.policy.loader import parse_policies
from controlplane.policy.snapshot import GpuReading, Node
from controlplane.policy_files import load_directory
from tests.policy.series import GiB, at, fleet, gpu, gpu_readings, healthy, replica

MB = 1_000_000

DEFAULTS = load_directory()


def problem_fleet():
    wedged = healthy(300) + healthy(180, start=310, requests_running=8.0, requests_waiting=3.0,
                                    generation_tokens_total=5e6, generation_tokens_per_second=0.0, canary_ok=False)
    replicas = [
        replica("ok-1", node="n1", gpus=[0], history=healthy(490)),
        replica("wedged", node="n1", gpus=[1], history=wedged),
        replica("on-bad-gpu", node="n2", gpus=[0], history=healthy(490)),
        replica("dead", node="n2", gpus=[1], state=ReplicaState.FATAL, restarts_total=6, last_exit_code=1,
                log_tail=["RuntimeError: engine core died"]),
    ]
    gpus = [
        gpu(0, node="n1", slowdown_temperature_celsius=89.0, history=gpu_readings(490, temperature_celsius=62.0)),
        gpu(1, node="n1", slowdown_temperature_celsius=89.0, history=gpu_readings(490, temperature_celsius=64.0)),
        gpu(0, node="n2", xid_events_total=1, last_xid=79,
            history=gpu_readings(490, xid_events_total=lambda t: 1 if t > 400 else 0)),
        gpu(1, node="n2", history=gpu_readings(490, temperature_celsius=60.0)),
    ]
    return fleet(490, replicas, gpus)


def test_each_problem_gets_its_policys_action_and_nothing_else_moves():
    snap = problem_fleet()
    actions = evaluate(DEFAULTS, snap, at(490))
    got = sorted((a.policy, a.kind, a.target.key) for a in actions)
    assert got == [
        ("crash-loop", "alert", "replica:n2/dead"),
        ("stall", "alert", "replica:n1/wedged"),
        ("stall", "restart", "replica:n1/wedged"),
        ("xid-hardware", "alert", "gpu:n2/0"),
        ("xid-hardware", "cordon", "node:n2"),
    ]
    page = next(a for a in actions if a.policy == "xid-hardware" and a.kind == "alert")
    assert page.params["severity"] == "page" and page.runbook_url == "runbooks/xid-hardware.md"
    assert "XID 79" in page.reason and page.findings[0].evidence
    restart = next(a for a in actions if a.kind == "restart")
    assert restart.replicas == ["n1/wedged"] and restart.model == "llama-8b"


def test_an_already_cordoned_node_is_not_cordoned_again_but_still_paged():
    snap = problem_fleet()
    snap = snap.model_copy(update={"nodes": [Node(name="n1"), Node(name="n2", cordoned=True)]})
    kinds = {(a.policy, a.kind) for a in evaluate(DEFAULTS, snap, at(490))}
    assert ("xid-hardware", "cordon") not in kinds and ("xid-hardware", "alert") in kinds


def test_a_healthy_fleet_proposes_nothing():
    snap = fleet(490, [replica("a", history=healthy(490)), replica("b", history=healthy(490))],
                 [gpu(0, history=gpu_readings(490, temperature_celsius=60.0))])
    assert evaluate(DEFAULTS, snap, at(490)) == []


def test_scope_selects_by_model_glob_node_and_label():
    [policy] = parse_policies(
        "name: prod-ttft\n"
        "scope: {models: ['llama-*'], nodes: ['gpu-*'], labels: {tier: prod}}\n"
        "condition: {signal: ttft_p99_seconds, op: '>', threshold: 0.5, for: 60s}\n"
        "action: {kind: alert, severity: warning}\n", "inline.yaml")
    slow = healthy(300, ttft_p99_seconds=0.9)
    replicas = [
        replica("in", node="gpu-1", model="llama-70b", labels={"tier": "prod"}, history=slow),
        replica("other-model", node="gpu-1", model="qwen-7b", labels={"tier": "prod"}, history=slow),
        replica("other-node", node="cpu-1", model="llama-70b", labels={"tier": "prod"}, history=slow),
        replica("other-tier", node="gpu-1", model="llama-70b", labels={"tier": "dev"}, history=slow),
    ]
    actions = evaluate([policy], fleet(300, replicas), at(300))
    assert [a.target.key for a in actions] == ["replica:gpu-1/in"]


def test_a_model_scope_holds_only_the_gpus_and_nodes_its_replicas_run_on():
    [hot] = parse_policies("name: hot-llama\nscope: {models: ['llama-*'], labels: {tier: prod}}\n"
                           "condition: {detector: thermal, margin_celsius: 5, for: 60s}\n"
                           "action: {kind: alert, severity: warning}\n", "hot.yaml")
    [dark] = parse_policies("name: dark-llama\nscope: {models: ['llama-*'], labels: {tier: prod}}\n"
                            "condition: {detector: node_unreachable, for: 60s}\n"
                            "action: {kind: alert, severity: page}\n", "dark.yaml")
    replicas = [replica("a", node="n1", model="llama-70b", labels={"tier": "prod"}, gpus=[0, 1]),
                replica("b", node="n1", model="qwen-7b", labels={"tier": "prod"}, gpus=[2]),
                replica("c", node="n2", model="qwen-7b", labels={"tier": "prod"}, gpus=[0]),
                replica("d", node="n3", model="llama-70b", labels={"tier": "dev"}, gpus=[0])]
    hot_history = gpu_readings(300, temperature_celsius=88.0)
    gpus = [gpu(i, node=n, slowdown_temperature_celsius=89.0, history=hot_history)
            for n, i in [("n1", 0), ("n1", 1), ("n1", 2), ("n2", 0), ("n2", 1), ("n3", 0)]]
    # Every node silent for four minutes: only n1 runs a selected replica.
    nodes = [Node(name=n, memory_total_bytes=512 * GiB, last_report_at=at(60)) for n in ("n1", "n2", "n3")]
    snap = fleet(300, replicas, gpus, nodes).model_copy(update={"reports_since": at(0)})
    assert sorted(a.target.key for a in evaluate([hot], snap, at(300))) == ["gpu:n1/0", "gpu:n1/1"]
    assert [a.target.key for a in evaluate([dark], snap, at(300))] == ["node:n1"]


def test_application_xid_restarts_the_replicas_on_that_gpu_only():
    replicas = [replica("on-gpu0", gpus=[0], history=healthy(600)),
                replica("on-gpu1", gpus=[1], history=healthy(600))]
    gpus = [gpu(0, xid_events_total=3, last_xid=13,
                history=gpu_readings(600, xid_events_total=lambda t: 3 if t > 500 else 2)),
            gpu(1, history=gpu_readings(600, xid_events_total=0))]
    actions = evaluate(DEFAULTS, fleet(600, replicas, gpus), at(600))
    assert [(a.policy, a.kind, a.target.key) for a in actions] == [
        ("xid-application", "restart", "replica:n1/on-gpu0")]


def test_disabled_policy_is_silent():
    [policy] = parse_policies("name: quiet-one\nenabled: false\ncondition: {detector: crash_loop}\n"
                              "action: {kind: alert}\n", "off.yaml")
    snap = fleet(10, [replica("dead", state=ReplicaState.FATAL)])
    assert evaluate([policy], snap, at(10)) == []


def test_rolling_restart_is_one_model_wide_action_taken_a_batch_at_a_time():
    [policy] = parse_policies("name: roll\ncondition: {detector: xid, blast_radius: application}\n"
                              "action: {kind: rolling_restart, batch_size: 2}\n", "roll.yaml")
    replicas = [replica(f"r{i}", gpus=[i], history=healthy(600)) for i in range(4)]
    gpus = [gpu(0, xid_events_total=1, last_xid=31,
                history=gpu_readings(600, xid_events_total=lambda t: 1 if t >= 600 else 0))]
    [act] = evaluate([policy], fleet(600, replicas, gpus), at(600))
    assert act.kind == "rolling_restart" and act.target.key == "model:llama-8b"
    assert act.replicas == ["n1/r0", "n1/r1", "n1/r2", "n1/r3"] and act.params["batch_size"] == 2


def test_cordon_can_fence_a_single_gpu():
    [policy] = parse_policies("name: fence\ncondition: {detector: xid, blast_radius: hardware}\n"
                              "action: {kind: cordon, scope: gpu}\n", "fence.yaml")
    gpus = [gpu(3, xid_events_total=1, last_xid=48)]
    [act] = evaluate([policy], fleet(600, [replica(gpus=[3])], gpus), at(600))
    assert act.kind == "cordon" and act.target.key == "gpu:n1/3"


def test_gpu_memory_leak_plans_a_restart_of_the_leaking_replica():
    leaking = healthy(1800, gpu_memory_bytes=lambda t: int(125 * GiB + 40 * MB * t / 60))
    snap = fleet(1800, [replica("leaky", history=leaking), replica("flat", history=healthy(1800))],
                 [gpu(0, memory_total_bytes=141 * GiB)])
    [act] = evaluate(DEFAULTS, snap, at(1800))
    assert (act.policy, act.kind, act.target.key) == ("gpu-memory-leak", "planned_restart", "replica:n1/leaky")
    assert act.params["within_seconds"] == 3600 and "MiB/min" in act.reason


def test_an_attached_engine_is_never_restarted_only_reported():
    wedged = healthy(300) + healthy(180, start=310, requests_running=8.0, requests_waiting=3.0,
                                    generation_tokens_total=5e6, generation_tokens_per_second=0.0, canary_ok=False)
    snap = fleet(490, [replica("ext", state=ReplicaState.ATTACHED, managed=False, history=wedged)])
    [act] = evaluate(DEFAULTS, snap, at(490))
    assert act.kind == "alert" and "restart it by hand" in act.reason


def test_uncorrected_ecc_errors_cordon_that_gpu_alone_and_page():
    replicas = [replica("on-gpu0", gpus=[0], history=healthy(600)),
                replica("on-gpu1", gpus=[1], history=healthy(600))]
    gpus = [gpu(0, history=gpu_readings(600, ecc_uncorrected_total=lambda t: 1 if t > 500 else 0)),
            gpu(1, history=gpu_readings(600, ecc_uncorrected_total=0))]
    actions = evaluate(DEFAULTS, fleet(600, replicas, gpus), at(600))
    assert sorted((a.policy, a.kind, a.target.key) for a in actions) == [
        ("ecc-uncorrected", "alert", "gpu:n1/0"), ("ecc-uncorrected", "cordon", "gpu:n1/0")]
    cordon = next(a for a in actions if a.kind == "cordon")
    assert cordon.params["scope"] == "gpu" and cordon.params["gpu"] == 0
    page = next(a for a in actions if a.kind == "alert")
    assert page.params["severity"] == "page" and page.runbook_url == "runbooks/ecc-uncorrected.md"
    assert "1 uncorrected ECC error(s) on GPU 0 of n1" in page.reason
    # Once the GPU is fenced, only the page is left.
    fenced = fleet(600, replicas, gpus, nodes=[Node(name="n1", cordoned_gpus=[0])])
    assert [(a.policy, a.kind) for a in evaluate(DEFAULTS, fenced, at(600))] == [("ecc-uncorrected", "alert")]


def test_hardware_then_application_xid_in_one_window_cordons_and_does_not_restart():
    replicas = [replica("on-gpu0", gpus=[0], history=healthy(600))]
    history = [GpuReading(at=r.at, xid_events_total=r.xid_events_total,
                          xids=(79,) if r.at == at(500) else (45,) if r.at == at(510) else ())
               for r in gpu_readings(600, xid_events_total=lambda t: 2 if t >= 510 else 1 if t >= 500 else 0)]
    gpus = [gpu(0, xid_events_total=2, last_xid=45, history=history)]
    actions = evaluate(DEFAULTS, fleet(600, replicas, gpus), at(600))
    assert sorted((a.policy, a.kind, a.target.key) for a in actions) == [
        ("xid-hardware", "alert", "gpu:n1/0"), ("xid-hardware", "cordon", "node:n1")]
