import json
import subprocess
import sys
from datetime import timedelta

import pytest

from controlplane.policy.guardrails import ActionRecord, GuardState
from controlplane.policy_cli import main
from controlplane.policy_files import DEFAULTS_DIR
from tests.policy.test_evaluate import problem_fleet
from tests.policy.test_loader import BROKEN


def test_check_accepts_the_defaults(capsys):
    assert main(["check", str(DEFAULTS_DIR)]) == 0
    assert capsys.readouterr().out.startswith("ok: 15 policies in 15 file(s)")


def test_check_reports_every_error_as_file_line_field(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("name: fine\ncondition: {detector: crash_loop}\naction: {kind: alert}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(BROKEN)
    assert main(["check", str(good), str(bad)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{bad}:8: condition.for: invalid duration '5 minutes': use a number of seconds or a form such "
                   "as 60s, 5m, 1h, 1h30m", f"{bad}:11: action.factr: Extra inputs are not permitted"]


def test_explain_shows_actions_guardrail_decisions_and_evidence(tmp_path, capsys):
    snap = problem_fleet()
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(snap.model_dump_json())
    # The stalled replica's restart happened 5 minutes ago: its cooldown holds the new one.
    state = GuardState(records=[ActionRecord(policy="stall", kind="restart", target="replica:n1/wedged",
                                             at=snap.now - timedelta(minutes=5), status="succeeded",
                                             replicas=["n1/wedged"], model="llama-8b")])
    state_file = tmp_path / "state.json"
    state_file.write_text(state.model_dump_json())
    assert main(["explain", "--snapshot", str(snapshot), "--guard-state", str(state_file)]) == 0
    out = capsys.readouterr().out
    assert "xid-hardware: acting" in out
    assert "[ALLOW] cordon node:n2" in out
    assert "[HOLD] restart replica:n1/wedged" in out and "guardrail cooldown" in out
    assert "ttft-slo: quiet" in out
    assert "evidence " in out and "runbook: runbooks/xid-hardware.md" in out


def test_explain_json_is_machine_readable(tmp_path, capsys):
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(problem_fleet().model_dump_json())
    assert main(["explain", "--snapshot", str(snapshot), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    verdicts = {(d["action"]["policy"], d["action"]["kind"]): d["verdict"]
                for p in report["policies"] for d in p["decisions"]}
    assert verdicts[("xid-hardware", "cordon")] == "allowed"
    assert verdicts[("stall", "restart")] == "allowed"


def test_explain_with_broken_policies_fails_like_check(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "bad.yaml").write_text(BROKEN)
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(problem_fleet().model_dump_json())
    assert main(["explain", "--snapshot", str(snapshot), "--policies", str(tmp_path / "p")]) == 1
    assert ":8: condition.for:" in capsys.readouterr().err


def test_explain_with_an_unreadable_snapshot_fails_cleanly(tmp_path, capsys):
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text('{"now": "not a time"}')
    assert main(["explain", "--snapshot", str(snapshot)]) == 1
    assert "pitstop policy:" in capsys.readouterr().err


@pytest.mark.slow
def test_pitstop_policy_command_runs_end_to_end(tmp_path):
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(problem_fleet().model_dump_json())
    check = subprocess.run([sys.executable, "-m", "pitstop.cli", "policy", "check", str(DEFAULTS_DIR)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and check.stdout.startswith("ok: 15 policies")
    explained = subprocess.run([sys.executable, "-m", "pitstop.cli", "policy", "explain", "--snapshot", str(snapshot),
                                "--no-evidence"], capture_output=True, text=True, timeout=60)
    assert explained.returncode == 0 and "[ALLOW] cordon node:n2" in explained.stdout


def test_check_notes_a_ttft_target_an_engines_buckets_cannot_resolve(tmp_path, capsys):
    fast = tmp_path / "fast.yaml"
    fast.write_text("name: ttft-fast\ncondition: {detector: threshold, signal: ttft_p99_seconds, op: '>', "
                    "threshold: 0.05, for: 2m}\naction: {kind: alert}\n")
    assert main(["check", str(fast)]) == 0  # a note, not an error: vLLM resolves it, SGLang can be told to
    out = capsys.readouterr().out.splitlines()
    assert out == [f"note: {fast}: policy ttft-fast: ttft_p99_seconds threshold 0.05 s is below SGLang's lowest "
                   "TTFT bucket (0.1 s): on SGLang replicas start SGLang with --bucket-time-to-first-token bounds "
                   "that include it", "ok: 1 policies in 1 file(s)"]
