"""The action contract: each kind's payload survives the store's JSON form, a stored payload that no longer
fits its kind is refused with the field named, and the engine-argument changes derive what they say."""

from __future__ import annotations

import json
import typing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from controlplane.policy.kinds import KINDS, ActionKind
from controlplane.policy.payloads import (
    AddEngineFlagPayload,
    AlertPayload,
    CanaryVerdictRecord,
    Captured,
    CordonPayload,
    CorruptPayload,
    DrainPayload,
    Judge,
    MaxNumSeqsPayload,
    PlannedRestartPayload,
    RestartPayload,
    RollingRestartPayload,
    RolloutPlan,
    SetFlagsPayload,
    SetLiveCapPayload,
    parse_payload,
    payload_json,
)

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
ARGS = ["--model", "llama-8b", "--max-num-seqs", "64"]

PLAN = RolloutPlan(
    phase="canary", queue=[["gpu-b/r1"]], done=["gpu-a/r0"], batch={"gpu-a/r0": 3}, batch_started_at=T0,
    canary="gpu-a/r0", previous_args=ARGS, canary_ready_at=T0 + timedelta(minutes=1),
    canary_verdict=CanaryVerdictRecord(verdict="pass", reason="no worse",
                                       figures={"canary_itl_p99_seconds": 0.02, "peers_ttft_p99_seconds": None}),
    baseline="itself before the change")

# One payload per kind, with every field a proposer or the executor may fill.
EXAMPLES: dict[ActionKind, BaseModel] = {
    ActionKind.RESTART: RestartPayload(
        runbook_url="runbooks/stall.md", applied={"gpu-a/r0": 2},
        captured={"gpu-a/r0": Captured(log_tail=["INFO step"], state="WEDGED", stack_dump="Thread 1 ...",
                                       stack_dump_note="py-spy")}),
    ActionKind.PLANNED_RESTART: PlannedRestartPayload(
        within_seconds=7200, not_before=T0, deadline=T0 + timedelta(hours=2), schedule="quietest hour",
        applied={"gpu-a/r0": 5}),
    ActionKind.DRAIN: DrainPayload(applied={"gpu-a/r0": None}),  # a drain applies no generation
    ActionKind.ROLLING_RESTART: RollingRestartPayload(batch_size=2, rollout=PLAN.model_copy(
        update={"phase": "rolling", "waiting": "waiting: 1 other replica(s) of llama-8b READY, budget needs 2"})),
    ActionKind.SET_FLAGS: SetFlagsPayload(engine_args={"gpu-a/r0": ["--max-num-seqs", "32"]}, applied={"gpu-a/r0": 2}),
    ActionKind.LOWER_MAX_NUM_SEQS: MaxNumSeqsPayload(
        kind="lower_max_num_seqs", max_num_seqs=32, previous=64, canary=True,
        judge=Judge(latencies=["itl_p99_seconds"], max_throughput_drop=0.3), rollout=PLAN),
    ActionKind.RAISE_MAX_NUM_SEQS: MaxNumSeqsPayload(kind="raise_max_num_seqs", max_num_seqs=128, previous=64,
                                                     engine_args={"gpu-a/r0": ["--max-num-seqs", "128"]}),
    ActionKind.ADD_ENGINE_FLAG: AddEngineFlagPayload(
        flag="--kv-cache-dtype", value="fp8", rung=2, multi_gpu=True, max_num_seqs=64, canary=True,
        judge=Judge(baseline="same_args", min_latency_gain=0.1), rollout=PLAN),
    ActionKind.SET_LIVE_CAP: SetLiveCapPayload(live_cap=None, previous=16, applied={"gpu-a/r0": 3}),
    ActionKind.CORDON: CordonPayload(kind="cordon", scope="gpu", gpu=3),
    ActionKind.UNCORDON: CordonPayload(kind="uncordon"),
    ActionKind.ALERT: AlertPayload(severity="page", governed=True, runbook_url="runbooks/crash-loop.md"),
}

# The least each kind needs: what an operator's request with no extras becomes.
MINIMAL: dict[ActionKind, dict[str, Any]] = {
    **{kind: {} for kind in ActionKind},
    ActionKind.LOWER_MAX_NUM_SEQS: {"max_num_seqs": 32, "previous": 64},
    ActionKind.RAISE_MAX_NUM_SEQS: {"max_num_seqs": 128, "previous": 64},
    ActionKind.ADD_ENGINE_FLAG: {"flag": "--enable-chunked-prefill", "rung": 1, "max_num_seqs": 64},
    ActionKind.SET_LIVE_CAP: {"live_cap": 16},
}


def test_every_kind_has_an_example() -> None:
    assert set(EXAMPLES) == set(ActionKind) == set(KINDS)


@pytest.mark.parametrize("kind", list(ActionKind), ids=str)
def test_a_payload_round_trips_through_its_json_form(kind: ActionKind) -> None:
    payload = EXAMPLES[kind]
    data = payload_json(payload)
    assert "kind" not in data  # the row and the API carry the kind beside the payload
    stored = json.loads(json.dumps(data))  # what the store's JSON column gives back
    assert stored == data
    again = parse_payload(kind, stored)
    assert again == payload
    assert payload_json(again) == data


@pytest.mark.parametrize("kind", list(ActionKind), ids=str)
def test_unset_fields_are_left_out_of_the_json_form(kind: ActionKind) -> None:
    data = payload_json(parse_payload(kind, MINIMAL[kind]))
    assert all(v is not None for k, v in data.items() if k != "value"), data
    assert "runbook_url" not in data and "rollout" not in data and "applied" not in data


def test_a_switch_keeps_its_null_value() -> None:
    switch = AddEngineFlagPayload(flag="--enable-chunked-prefill", rung=1, max_num_seqs=64)
    data = payload_json(switch)
    assert "value" in data and data["value"] is None  # null: a switch, not a flag whose value was lost
    assert "judge" not in data and "rollout" not in data
    assert parse_payload("add_engine_flag", data) == switch


def test_a_stack_dump_that_never_came_stays_null() -> None:
    restart = RestartPayload(captured={"gpu-a/r0": Captured(log_tail=["x"], state=None, stack_dump=None,
                                                            stack_dump_note="the agent sent none")})
    captured = payload_json(restart)["captured"]["gpu-a/r0"]
    assert captured == {"log_tail": ["x"], "state": None, "stack_dump": None,
                        "stack_dump_note": "the agent sent none"}
    assert parse_payload("restart", payload_json(restart)) == restart


def test_a_drains_null_generation_and_a_missing_figure_stay_null() -> None:
    assert payload_json(EXAMPLES[ActionKind.DRAIN])["applied"] == {"gpu-a/r0": None}
    figures = payload_json(EXAMPLES[ActionKind.LOWER_MAX_NUM_SEQS])["rollout"]["canary_verdict"]["figures"]
    assert figures == {"canary_itl_p99_seconds": 0.02, "peers_ttft_p99_seconds": None}


def test_a_stored_kind_key_does_not_change_the_kind() -> None:
    # The row's kind column is the truth; a "kind" left inside the params cannot turn a raise into a lower.
    payload = parse_payload("raise_max_num_seqs", {"kind": "lower_max_num_seqs", "max_num_seqs": 128, "previous": 64})
    assert payload.kind == "raise_max_num_seqs"


@pytest.mark.parametrize(("kind", "data", "field"), [
    ("set_flags", {"engine_args": "not a dict"}, "engine_args"),
    ("set_flags", {"engine_args": {"gpu-a/r0": "--max-num-seqs 32"}}, "engine_args.gpu-a/r0"),
    ("restart", {"bogus": 1}, "bogus"),
    ("restart", {"captured": {"gpu-a/r0": {"log_tail": "one line"}}}, "captured.gpu-a/r0.log_tail"),
    ("restart", {"captured": {"gpu-a/r0": {"stack": "x"}}}, "captured.gpu-a/r0.stack"),
    ("planned_restart", {"within_seconds": 0}, "within_seconds"),
    ("planned_restart", {"not_before": "2026-12-01T12:00:00"}, "not_before"),  # no zone: ambiguous
    ("drain", {"applied": {"gpu-a/r0": "two"}}, "applied.gpu-a/r0"),
    ("rolling_restart", {"batch_size": "many"}, "batch_size"),
    ("rolling_restart", {"batch_size": 0}, "batch_size"),
    ("rolling_restart", {"rollout": {"phase": "sideways"}}, "rollout.phase"),
    ("rolling_restart", {"rollout": {"phase": "rolling", "batch": {"gpu-a/r0": "x"}}}, "rollout.batch.gpu-a/r0"),
    ("lower_max_num_seqs", {"max_num_seqs": 32}, "previous"),
    ("raise_max_num_seqs", {"max_num_seqs": 0, "previous": 64}, "max_num_seqs"),
    ("lower_max_num_seqs", {"max_num_seqs": 32, "previous": 64, "judge": {"max_throughput_drop": 1.5}},
     "judge.max_throughput_drop"),
    ("add_engine_flag", {"flag": "enable-chunked-prefill", "rung": 1, "max_num_seqs": 64}, "flag"),
    ("add_engine_flag", {"flag": "--x", "rung": 1, "max_num_seqs": 64, "judge": {"baseline": "nobody"}},
     "judge.baseline"),
    ("cordon", {"scope": "rack"}, "scope"),
    ("uncordon", {"gpu": 4096}, "gpu"),
    ("alert", {"severity": "loud"}, "severity"),
])
def test_a_payload_that_does_not_fit_its_kind_is_corrupt_and_names_the_field(kind: str, data: dict[str, Any],
                                                                             field: str) -> None:
    with pytest.raises(CorruptPayload) as corrupt:
        parse_payload(kind, data)
    message = str(corrupt.value)
    assert f"stored {kind!r} payload" in message
    assert f"{field}:" in message, message
    assert isinstance(corrupt.value, ValueError)


def test_an_unknown_kind_is_corrupt() -> None:
    with pytest.raises(CorruptPayload) as corrupt:
        parse_payload("explode", {})
    assert "stored 'explode' payload" in str(corrupt.value) and "kind:" in str(corrupt.value)


@pytest.mark.parametrize("kind", list(ActionKind), ids=str)
def test_every_kind_has_a_payload_model_that_takes_it(kind: ActionKind) -> None:
    model = KINDS[kind].payload
    literal = model.model_fields["kind"].annotation
    assert kind.value in typing.get_args(literal)
    parsed = parse_payload(kind, MINIMAL[kind])
    assert type(parsed) is model and parsed.kind == kind.value


def test_payload_models_are_frozen() -> None:
    # A payload read from the store is a value: progress is written back as a copy, never by mutation.
    with pytest.raises(ValueError, match="frozen"):
        EXAMPLES[ActionKind.ALERT].severity = "info"  # type: ignore[attr-defined]


# --- the engine-argument changes -----------------------------------------------------------------------------

LOWER = MaxNumSeqsPayload(kind="lower_max_num_seqs", max_num_seqs=32, previous=64)


@pytest.mark.parametrize(("args", "derived"), [
    (ARGS, ["--model", "llama-8b", "--max-num-seqs", "32"]),
    (["--max-num-seqs=64", "--port", "9001"], ["--port", "9001", "--max-num-seqs", "32"]),
    (["--model", "llama-8b"], ["--model", "llama-8b", "--max-num-seqs", "32"]),  # vLLM's default replaced too
])
def test_max_num_seqs_derives_the_new_value_once(args: list[str], derived: list[str]) -> None:
    assert LOWER.derive(args) == derived


@pytest.mark.parametrize(("args", "needs"), [
    (ARGS, True),
    (["--max-num-seqs", "32"], False),
    (["--max-num-seqs=32"], False),
    (["--model", "llama-8b"], True),
])
def test_max_num_seqs_needs_only_engines_not_at_the_value(args: list[str], needs: bool) -> None:
    assert LOWER.needs(args, [0]) is needs


def test_args_for_uses_the_listed_arguments_else_derives_from_the_current_ones() -> None:
    change = LOWER.model_copy(update={"engine_args": {"gpu-a/r0": ["--max-num-seqs", "32", "--port", "1"]}})
    assert change.args_for("gpu-a/r0", ARGS) == ["--max-num-seqs", "32", "--port", "1"]
    assert change.args_for("gpu-b/r1", ARGS) == ["--model", "llama-8b", "--max-num-seqs", "32"]
    assert change.change == "--max-num-seqs 32"


SWITCH = AddEngineFlagPayload(flag="--enable-chunked-prefill", rung=1, max_num_seqs=64)
VALUED = AddEngineFlagPayload(flag="--kv-cache-dtype", value="fp8", rung=2, max_num_seqs=64)
MULTI = AddEngineFlagPayload(flag="--enable-expert-parallel", rung=3, multi_gpu=True, max_num_seqs=64)


@pytest.mark.parametrize(("rung", "args", "derived"), [
    (SWITCH, ARGS, [*ARGS, "--enable-chunked-prefill"]),
    (SWITCH, [*ARGS, "--enable-chunked-prefill"], [*ARGS, "--enable-chunked-prefill"]),  # a switch once
    (VALUED, ARGS, [*ARGS, "--kv-cache-dtype", "fp8"]),
    (VALUED, ["--kv-cache-dtype", "auto", *ARGS], [*ARGS, "--kv-cache-dtype", "fp8"]),  # replaces the old value
], ids=["switch", "switch-twice", "valued", "valued-replaces"])
def test_a_flag_rung_derives_its_flag(rung: AddEngineFlagPayload, args: list[str], derived: list[str]) -> None:
    assert rung.derive(args) == derived


@pytest.mark.parametrize(("rung", "args", "gpus", "needs"), [
    (SWITCH, ARGS, [0], True),
    (SWITCH, [*ARGS, "--enable-chunked-prefill"], [0], False),
    (VALUED, [*ARGS, "--kv-cache-dtype", "auto"], [0], True),
    (VALUED, [*ARGS, "--kv-cache-dtype=fp8"], [0], False),
    (MULTI, ARGS, [0], False),  # a multi-GPU rung skips a one-GPU engine
    (MULTI, ARGS, [0, 1], True),
    (MULTI, [*ARGS, "--tensor-parallel-size", "2"], [0], True),
    (MULTI, [*ARGS, "--enable-expert-parallel"], [0, 1], False),
], ids=["switch-lacks", "switch-has", "valued-other", "valued-same", "multi-one-gpu", "multi-two-gpus",
        "multi-tp2", "multi-has"])
def test_a_flag_rung_needs_engines_that_take_it_and_lack_it(rung: AddEngineFlagPayload, args: list[str],
                                                            gpus: list[int], needs: bool) -> None:
    assert rung.needs(args, gpus) is needs


def test_a_flag_rung_says_its_change_in_words() -> None:
    assert (SWITCH.change, VALUED.change) == ("--enable-chunked-prefill", "--kv-cache-dtype fp8")
    assert not MULTI.takes(ARGS, [0]) and MULTI.takes(ARGS, [0, 1]) and SWITCH.takes(ARGS, [0])


def test_set_flags_is_the_operators_list_and_derives_nothing() -> None:
    flags = SetFlagsPayload(engine_args={"gpu-a/r0": ["--max-num-seqs", "16"]})
    assert flags.args_for("gpu-a/r0", ARGS) == ["--max-num-seqs", "16"]
    assert flags.args_for("gpu-b/r1", ARGS) == ARGS  # a replica it does not list keeps its arguments
    assert not flags.needs(ARGS, [0])
