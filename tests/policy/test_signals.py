"""The table of replica signals: every field of a sample is declared, and every declaration reaches each part that
derives from it (ingest, history, retention, threshold conditions, the API)."""

from __future__ import annotations

import ast
import typing
from dataclasses import fields
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from agent.wire import EngineSample, ProcessSample, ReplicaStatus
from controlplane.policy import conditions
from controlplane.policy.signals import (
    DECLARED,
    NOT_SIGNALS,
    REPLICA_SAMPLE_FIELDS,
    ROLLUPS,
    SIGNALS,
    THRESHOLD_SIGNALS,
    ReplicaSample,
    from_stored,
    stored_model,
)

ROOT = Path(__file__).resolve().parents[2]
AT = datetime(2026, 12, 1, tzinfo=UTC)
# The field type each way of storing reads back as.
TYPES = {"float": "float | None", "int": "int | None", "digest": "int | None", "bool": "bool | None",
         "window": "EngineWindow | None"}
# The modules that store, read back, fold and serve samples: all of it comes from the table, none names a signal.
DERIVED = ("fleet/ingest.py", "fleet/backfill.py", "fleet/schemas.py", "fleet/queries.py", "remediation/history.py",
           "remediation/rollout.py", "remediation/snapshot.py", "retention.py", "api/fleet.py")


def test_every_field_of_a_sample_is_a_declared_signal_typed_as_it_is_stored() -> None:
    assert REPLICA_SAMPLE_FIELDS - {"at"} == SIGNALS
    for f in fields(ReplicaSample):
        if f.name != "at":
            assert f.type == TYPES[DECLARED[f.name].stored], f.name
            assert DECLARED[f.name].description and DECLARED[f.name].unit, f.name


def test_a_signal_read_from_the_report_names_a_field_of_it() -> None:
    parts = {"engine": EngineSample.model_fields, "process": ProcessSample.model_fields,
             "status": ReplicaStatus.model_fields}
    for name, declared in DECLARED.items():
        if isinstance(declared.source, str):
            assert (declared.wire or name) in parts[declared.source], name
    # Every engine figure an agent reports is a signal by the same name, or said not to be one.
    assert set(EngineSample.model_fields) - NOT_SIGNALS <= SIGNALS


def test_every_declaration_reaches_what_derives_from_it() -> None:
    assert set(ROLLUPS) == SIGNALS
    assert set(stored_model().model_fields) == SIGNALS
    # Read back in full, every stored key becomes its field; the history cache's read keeps only the cached ones.
    stored = {name: 1.0 for name in SIGNALS if DECLARED[name].stored != "window"}
    full, cached = from_stored(AT, stored, full=True), from_stored(AT, stored)
    for name in stored:
        assert getattr(full, name) is not None, name
        assert (getattr(cached, name) is not None) == DECLARED[name].cached, name
    assert set(THRESHOLD_SIGNALS) <= {n for n, d in DECLARED.items() if d.cached and d.stored in ("float", "int")}


@pytest.mark.parametrize("path", DERIVED)
def test_the_modules_that_store_and_serve_samples_name_no_signal(path: str) -> None:
    # A new signal is the table and its producer: nothing downstream lists signals by hand. (A row of the replicas
    # table, a dict literal, has columns of the same names: its keys are not counted.)
    tree = ast.parse((ROOT / "controlplane" / path).read_text())
    columns = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
    named = {n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and n.value in SIGNALS and id(n) not in columns}
    assert not named, f"{path} names {sorted(named)}"


def test_a_threshold_condition_names_a_threshold_signal() -> None:
    condition = {"signal": "itl_p99_seconds", "op": ">", "threshold": 0.2, "for": 60}
    assert conditions.ThresholdCondition.model_validate(condition).signal == "itl_p99_seconds"
    with pytest.raises(ValidationError, match="no signal a threshold may name"):
        conditions.ThresholdCondition.model_validate({**condition, "signal": "flags_key"})
    schema = conditions.ThresholdCondition.model_json_schema()["properties"]["signal"]
    assert schema["enum"] == list(THRESHOLD_SIGNALS)


def test_a_stored_average_reads_back_as_the_signals_types() -> None:
    # One-minute averages: an int rounded down, a boolean true when it held at least half the minute.
    sample = from_stored(AT, {"rss_bytes": 1024.75, "canary_ok": 0.5, "generation": 3.0, "errors_per_second": 0.0})
    assert (sample.rss_bytes, sample.canary_ok, sample.generation) == (1024, True, 3)
    assert from_stored(AT, {"canary_ok": 0.25}).canary_ok is False
    assert sample.errors_per_second == 0.0 and sample.requests_running is None
    with pytest.raises(ValueError, match="no timezone"):
        from_stored(datetime(2026, 12, 1), {})


def test_the_api_model_documents_each_signal_with_its_unit() -> None:
    model: type[BaseModel] = stored_model()
    schema = model.model_json_schema()
    for name, declared in DECLARED.items():
        documented = schema["properties"][name]
        assert documented["x-unit"] == declared.unit and declared.description in documented["description"]
    assert typing.get_origin(model.model_fields["window"].annotation) is not None  # optional, typed
