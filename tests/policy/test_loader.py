from pathlib import Path

import pytest

from controlplane.policy.actions import AlertAction, CordonAction, LowerMaxNumSeqsAction
from controlplane.policy.conditions import EccCondition, ThresholdCondition
from controlplane.policy.durations import parse_duration
from controlplane.policy.loader import PolicyLoadError
from controlplane.policy_files import DEFAULTS_DIR, load_directory, load_files

REPO = Path(__file__).resolve().parents[2]

BROKEN = """\
name: ttft-slo
scope:
  models: ["llama-*"]
condition:
  signal: ttft_p99_seconds
  op: ">"
  threshold: 0.5
  for: 5 minutes
action:
  kind: lower_max_num_seqs
  factr: 0.5
guardrails:
  cooldown: 10m
"""


def errors_of(tmp_path: Path, text: str, name: str = "policy.yaml"):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(PolicyLoadError) as info:
        load_files([path])
    return path, info.value.errors


def test_errors_name_the_file_the_line_and_the_field(tmp_path):
    path, errors = errors_of(tmp_path, BROKEN)
    assert [(e.file, e.line, e.field) for e in errors] == [
        (str(path), 8, "condition.for"), (str(path), 11, "action.factr")]
    assert "5 minutes" in errors[0].message and "60s, 5m, 1h" in errors[0].message
    assert str(errors[1]) == f"{path}:11: action.factr: Extra inputs are not permitted"


def test_unknown_detector_and_bad_enum_point_at_their_lines(tmp_path):
    text = "- name: a\n  condition:\n    detector: leek\n  action: {kind: alert}\n" \
           "- name: b\n  condition: {detector: crash_loop}\n  action:\n    kind: alert\n    severity: pag\n"
    _, errors = errors_of(tmp_path, text)
    assert [(e.line, e.field) for e in errors] == [(3, "condition"), (9, "action.severity")]
    assert "unknown detector" in errors[0].message and "'pag'" in errors[1].message


def test_missing_field_names_it_at_its_parent(tmp_path):
    _, errors = errors_of(tmp_path, "name: x\ncondition:\n  detector: leak\naction: {kind: alert}\n")
    assert [(e.line, e.field) for e in errors] == [(3, "condition.resource")]


def test_yaml_syntax_error_gives_its_line(tmp_path):
    _, errors = errors_of(tmp_path, "name: x\ncondition: {detector: stall\naction: {kind: alert}\n")
    assert errors[0].line >= 2 and "invalid YAML" in errors[0].message


def test_governor_needs_a_latency_upper_bound(tmp_path):
    text = ("name: x\ncondition: {signal: requests_per_second, op: '<', threshold: 1, for: 1m}\n"
            "action: {kind: lower_max_num_seqs}\n")
    _, errors = errors_of(tmp_path, text)
    assert "needs a threshold condition with op '>'" in errors[0].message


def test_duplicate_names_across_files(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    for p in (a, b):
        p.write_text("name: same\ncondition: {detector: crash_loop}\naction: {kind: alert}\n")
    with pytest.raises(PolicyLoadError) as info:
        load_files([a, b])
    assert info.value.errors[0].file == str(b) and "duplicate" in info.value.errors[0].message


@pytest.mark.parametrize(("text", "seconds"), [("60s", 60), ("5m", 300), ("1h", 3600), ("1h30m", 5400), (90, 90),
                                               ("250ms", 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "m", "", "-5s", True, -3])
def test_bad_durations(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_default_policy_set_loads_and_each_has_a_runbook():
    policies = load_directory()
    names = {p.name for p in policies}
    assert {"ttft-slo", "itl-slo", "error-rate", "stall", "rss-leak", "gpu-memory-leak", "thermal",
            "thermal-sustained", "xid-hardware", "xid-application", "crash-loop", "oom-crash",
            "ecc-uncorrected"} <= names
    for p in policies:
        assert p.runbook_url == f"runbooks/{p.name}.md"
        assert (REPO / p.runbook_url).is_file(), p.runbook_url
    index = (REPO / "runbooks" / "README.md").read_text()
    assert all(f"({p.name}.md)" in index for p in policies)
    assert len(list(DEFAULTS_DIR.glob("*.yaml"))) == len(policies)


def test_default_itl_slo_is_the_governor_and_ttft_slo_alerts():
    policies = {p.name: p for p in load_directory()}
    itl, ttft = policies["itl-slo"], policies["ttft-slo"]
    assert isinstance(itl.condition, ThresholdCondition) and itl.condition.signal == "itl_p99_seconds"
    assert itl.condition.threshold == 0.2 and itl.condition.for_ == 60
    assert isinstance(itl.action, LowerMaxNumSeqsAction) and itl.action.canary and itl.action.raise_ is not None
    assert itl.action.step == "proportional" and itl.action.max_throughput_drop == 0.35
    assert isinstance(ttft.condition, ThresholdCondition) and ttft.condition.threshold == 0.5
    assert isinstance(ttft.action, AlertAction) and ttft.action.severity == "warning"
    # Exactly one policy governs --max-num-seqs, so two never fight over it.
    assert [p.name for p in policies.values() if isinstance(p.action, LowerMaxNumSeqsAction)] == ["itl-slo"]


def test_default_ecc_policy_cordons_the_gpu_and_pages():
    ecc = {p.name: p for p in load_directory()}["ecc-uncorrected"]
    assert isinstance(ecc.condition, EccCondition) and ecc.condition.within == 900 and ecc.condition.min_increase == 1
    assert isinstance(ecc.action, CordonAction) and ecc.action.scope == "gpu"
    assert ecc.notify is not None and ecc.notify.severity == "page"
    assert ecc.runbook_url == "runbooks/ecc-uncorrected.md"


def test_proportional_step_is_only_for_inter_token_latency(tmp_path):
    text = ("name: x\ncondition: {signal: ttft_p99_seconds, op: '>', threshold: 0.5, for: 1m}\n"
            "action: {kind: lower_max_num_seqs, step: proportional}\n")
    path, errors = errors_of(tmp_path, text)
    assert "step proportional models inter-token latency" in errors[0].message
    assert "ttft_p99_seconds" in errors[0].message and errors[0].file == str(path)


def test_unknown_step_names_its_line(tmp_path):
    text = ("name: x\ncondition: {signal: itl_p99_seconds, op: '>', threshold: 0.2, for: 1m}\naction:\n"
            "  kind: lower_max_num_seqs\n  step: halve\n  headroom: 1.5\n")
    _, errors = errors_of(tmp_path, text)
    assert [(e.line, e.field) for e in errors] == [(5, "action.step"), (6, "action.headroom")]
    assert "'halve'" in errors[0].message


RUNGS = """\
name: x
condition: {signal: itl_p99_seconds, op: ">", threshold: 0.2, for: 1m}
action:
  kind: lower_max_num_seqs
  then:
    - flag: --disable-custom-all-reduce
    - flag: --block-size
    - {flag: --enforce-eager, value: "yes"}
    - {flag: --max-num-seqs, value: 8}
    - {flag: block-size, value: 32}
"""


def test_flag_rungs_are_checked_each_at_its_own_line(tmp_path):
    _, errors = errors_of(tmp_path, RUNGS)
    assert [(e.line, e.field) for e in errors] == [
        (6, "action.then[0]"), (7, "action.then[1]"), (8, "action.then[2]"), (9, "action.then[3]"),
        (10, "action.then[4].flag")]
    assert "set multi_gpu: true" in errors[0].message and "needs a value" in errors[1].message
    assert "is a switch" in errors[2].message and "governor's own lever" in errors[3].message


@pytest.mark.parametrize(("tail", "field", "message"), [
    ("  then:\n    - {flag: --block-size, value: 32}\n    - {flag: --block-size, value: 8}\n", "action.then",
     "--block-size appears more than once"),
    ("  pressure:\n    - {signal: preemptions_per_second, op: '<', threshold: 1, for: 1m}\n", "action.pressure",
     "use op '>' or '>='"),
])
def test_a_ladder_naming_a_flag_twice_or_a_pressure_that_is_no_upper_bound_is_refused(tmp_path, tail, field,
                                                                                         message):
    _, errors = errors_of(tmp_path, RUNGS.split("  then:")[0] + tail)
    assert [(e.line, e.field) for e in errors] == [(6, field)]
    assert message in errors[0].message


def test_the_shipped_ladder_is_the_practitioners_order():
    itl = next(p for p in load_directory() if p.name == "itl-slo")
    assert isinstance(itl.action, LowerMaxNumSeqsAction)
    assert [(r.label, r.multi_gpu) for r in itl.action.then] == [
        ("--disable-custom-all-reduce", True), ("--block-size 32", False)]
