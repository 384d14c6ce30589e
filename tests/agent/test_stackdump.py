"""Stack dumps before a restart: the dump step with a fake runner, then real py-spy on real processes."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from agent.stackdump import (
    MESSAGE_LIMIT,
    RunResult,
    StackDumper,
    condense,
    core_pid,
    find_py_spy,
    run_subprocess,
)
from agent.wire import DesiredState, ReplicaSpec
from tests.agent.conftest import AgentProcess, ControlPlaneStandIn
from tests.agent.test_agent_slow import sim_replica
from tests.helpers import wait_until

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# The fake runner's target: above Linux's highest pid_max (2**22), so no process on the host has it and the
# kernel view a failed dump falls back to finds nothing there, as for a process gone by then.
PID = 2**22 + 1
DUMP = f"""Process {PID}: python -m pitstop.cli sim serve tiny
Python v3.11.7 (/usr/bin/python3.11)

Thread {PID} (idle): "MainThread"
    EpollSelector.select (selectors.py:468)
    main (enginesim/cli.py:149)
"""
PY_SPY = find_py_spy()


class FakeRunner:
    """Answers ``--version`` and ``dump`` from a table; ``hang`` makes the dump time out like a stuck py-spy."""

    def __init__(self, dump: RunResult | None = None, *, hang: bool = False) -> None:
        self.dump = dump or RunResult(0, DUMP, "")
        self.hang = hang
        self.calls: list[tuple[list[str], float]] = []

    async def __call__(self, argv: list[str], limit: float) -> RunResult:
        self.calls.append((argv, limit))
        if argv[1] == "--version":
            return RunResult(0, "py-spy 0.4.3\n", "")
        if self.hang:
            raise TimeoutError
        return self.dump


def _dump(dumper: StackDumper, pid: int = PID) -> tuple[str, str | None, str]:
    result = asyncio.run(dumper.dump(pid))
    return result.note, result.text, result.message


def test_a_dump_carries_its_note_then_the_stacks() -> None:
    runner = FakeRunner()
    note, text, message = _dump(StackDumper("/opt/py-spy", "n1", runner=runner, timeout=10, wall=lambda: AT))
    assert note == f"captured by py-spy 0.4.3 at 2026-11-29T12:00:00+00:00 from pid {PID} on node n1"
    assert text is not None and "main (enginesim/cli.py:149)" in text
    assert message.splitlines()[0] == note and message.endswith("main (enginesim/cli.py:149)")
    assert runner.calls[1][0] == ["/opt/py-spy", "dump", "--pid", str(PID), "--subprocesses"]
    assert runner.calls[1][1] <= 10


def test_a_missing_py_spy_is_recorded_without_running_anything() -> None:
    note, text, _ = _dump(StackDumper(None, "n1", runner=FakeRunner(), wall=lambda: AT))
    assert (note, text) == ("no stack dump: py-spy not installed on node n1", None)


def test_a_hanging_py_spy_is_given_up_on_and_said_so() -> None:
    note, text, _ = _dump(StackDumper("/opt/py-spy", "n1", runner=FakeRunner(hang=True), timeout=3, wall=lambda: AT))
    assert text is None and note == f"no stack dump: py-spy gave no dump of pid {PID} within 3s on node n1"


def test_a_refused_ptrace_says_what_to_do() -> None:
    refused = RunResult(1, "", "Error: Permission denied (os error 13)\n\nStack backtrace:\n 0: anyhow")
    note, text, _ = _dump(StackDumper("/opt/py-spy", "n1", runner=FakeRunner(refused), wall=lambda: AT))
    assert text is None
    assert note == (f"no stack dump: py-spy failed on pid {PID}: Permission denied (os error 13) (ptrace refused: "
                    "run the agent as root or with CAP_SYS_PTRACE) on node n1")


# What py-spy 0.4 printed for a process under SIGSTOP (a frozen API server), recorded.
SUSPEND_FAILED = """Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: unexpected waitpid result PtraceEvent(Pid(10833), SIGSTOP, 128) to 10833

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_spy::PythonSpy::get_stack_traces
"""


class SuspendFails(FakeRunner):
    """py-spy as it answers for a stopped process: the suspending dump fails, the non-blocking one reads it."""

    def __init__(self, nonblocking: RunResult | None = None) -> None:
        super().__init__()
        self.nonblocking = nonblocking or RunResult(0, DUMP, "")

    async def __call__(self, argv: list[str], limit: float) -> RunResult:
        self.calls.append((argv, limit))
        if argv[1] == "--version":
            return RunResult(0, "py-spy 0.4.3\n", "")
        return self.nonblocking if "--nonblocking" in argv else RunResult(1, "", SUSPEND_FAILED)


def test_a_process_that_cannot_be_suspended_is_read_without_suspending_it_and_the_note_says_so() -> None:
    runner = SuspendFails()
    note, text, _ = _dump(StackDumper("/opt/py-spy", "n1", runner=runner, timeout=10, wall=lambda: AT))
    assert text is not None and "main (enginesim/cli.py:149)" in text
    assert note.startswith(f"captured by py-spy 0.4.3 at 2026-11-29T12:00:00+00:00 from pid {PID} on node n1 without "
                           "suspending it (--nonblocking: stacks may be torn)"), note
    assert "Failed to get stack traces: Failed to suspend process: unexpected waitpid result" in note
    assert [argv[-1] for argv, _ in runner.calls[1:]] == ["--subprocesses", "--nonblocking"]


def test_with_no_python_stacks_at_all_the_kernel_view_of_every_thread_is_kept(
        sleeper: subprocess.Popen[bytes]) -> None:
    runner = SuspendFails(RunResult(1, "", "Error: Failed to find python version from target process\n"))
    note, text, message = _dump(StackDumper("/opt/py-spy", "n1", runner=runner, wall=lambda: AT), sleeper.pid)
    assert note.startswith("no Python stacks (py-spy failed on pid"), note
    assert "Failed to suspend process" in note and "Failed to find python version" in note
    assert text is not None
    assert text.splitlines()[0].startswith(f"Process {sleeper.pid}: {sys.executable}")
    # Every thread, its state and wait channel (a sleeping one: S, in a kernel wait); its kernel stack only
    # where this user may read it.
    assert f"Thread {sleeper.pid} (S, waiting in " in text, text
    assert message.startswith(note)


def test_py_spy_is_gone_and_the_process_too_leaves_only_the_reason() -> None:
    note, text, _ = _dump(StackDumper(None, "n1", wall=lambda: AT))
    assert (note, text) == ("no stack dump: py-spy not installed on node n1", None)


def test_condense_keeps_every_thread_and_its_top_frames_within_the_event_limit() -> None:
    threads = [f'Thread {n} (idle): "worker-{n}"\n' + "".join(f"    frame_{n}_{d} (mod.py:{d})\n" for d in range(40))
               for n in range(60)]
    text = "Process 1: python\nPython v3.11\n\n" + "".join(threads)
    short = condense(text)
    assert len(short) <= MESSAGE_LIMIT
    assert all(f'"worker-{n}"' in short for n in range(60))  # every thread is named
    assert all(f"frame_{n}_0 " in short for n in range(60))  # with its innermost frame
    assert "frame_0_39 " not in short
    assert condense("small") == "small"


def test_py_spy_is_found_on_path_or_beside_python(tmp_path: Path) -> None:
    assert find_py_spy(path=str(tmp_path), python=str(tmp_path / "bin" / "python")) is None
    beside = tmp_path / "bin" / "py-spy"
    beside.parent.mkdir()
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert find_py_spy(path=str(tmp_path), python=str(tmp_path / "bin" / "python")) == str(beside)
    assert find_py_spy(tmp_path / "nowhere") is None  # a configured path that is not there finds nothing
    assert find_py_spy(beside) == str(beside)


def _ptrace_refused() -> str | None:
    """Why py-spy cannot attach to a child here, or None (Yama 0/1 allows a parent to trace its children)."""
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    if scope.exists() and scope.read_text().strip() in ("2", "3"):
        return f"kernel.yama.ptrace_scope is {scope.read_text().strip()}: only CAP_SYS_PTRACE may attach"
    return None


needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed (pip install 'py-spy>=0.3.14')")


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    script = tmp_path / "wedged.py"
    script.write_text("import time\n\ndef wedged_engine_core():\n    while True:\n        time.sleep(60)\n\n"
                      "print('up', flush=True)\nwedged_engine_core()\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        # Asleep in its long wait (S), as a wedged engine sits: not caught between the print and the sleep.
        wait_until(lambda: Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] == "S", 30,
                   what="the sleeper asleep")
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
@needs_py_spy
def test_real_py_spy_dumps_a_real_process_and_a_stuck_one_is_cut_off(sleeper: subprocess.Popen[bytes]) -> None:
    if (why := _ptrace_refused()) is not None:
        pytest.skip(why)
    note, text, _ = _dump(StackDumper(PY_SPY, "n1", timeout=10, wall=lambda: AT), sleeper.pid)
    assert note.startswith("captured by py-spy "), note
    assert text is not None and "wedged_engine_core (wedged.py:" in text
    # Frozen (SIGSTOP, as a hung API server looks to py-spy): read without suspending it, the same frames.
    sleeper.send_signal(signal.SIGSTOP)
    try:
        note, text, _ = _dump(StackDumper(PY_SPY, "n1", timeout=10, wall=lambda: AT), sleeper.pid)
    finally:
        sleeper.send_signal(signal.SIGCONT)
    assert "without suspending it" in note and "Failed to suspend process" in note, note
    assert text is not None and "wedged_engine_core (wedged.py:" in text
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(run_subprocess([sys.executable, "-c", "import time; time.sleep(30)"], 0.3))
    assert time.monotonic() - started < 5


@pytest.mark.slow
@needs_py_spy
def test_the_agent_dumps_the_engine_before_draining_it_for_a_capturing_restart(
        start_agent: Callable[..., AgentProcess], control_plane: tuple[ControlPlaneStandIn, str]) -> None:
    if (why := _ptrace_refused()) is not None:
        pytest.skip(why)
    stand_in, url = control_plane
    agent = start_agent([sim_replica("a")], control_plane=url)
    first = agent.wait_state("a", "READY")["process"]["pid"]
    stand_in.desired = DesiredState(node="test-node", replicas=[
        ReplicaSpec(name="a", generation=1, engine_args=list(sim_replica()["args"]), capture_stack=True)])
    wait_until(lambda: agent.replica("a")["generation"] == 1 and agent.replica("a")["state"] == "READY", 30,
               what=f"a restarted at generation 1\n{agent.output()}")
    assert agent.replica("a")["process"]["pid"] != first
    events = [e for r in stand_in.reports for e in r.events if e.replica == "a"]
    kinds = [e.kind if e.kind != "transition" else f"->{e.to_state}" for e in events]
    dumps = [e for e in events if e.kind == "stack_dump"]
    assert len(dumps) == 1, kinds  # one dump per capturing generation
    assert kinds.index("stack_dump") < kinds.index("->DRAINING"), kinds  # taken before the drain
    note, _, dump = dumps[0].message.partition("\n")
    assert note.startswith("captured by py-spy ") and f"from pid {first}" in note
    assert "main (enginesim/cli.py:" in dump  # a real frame of the simulated engine


def test_the_engines_busy_loop_is_found_by_its_adapters_process_title() -> None:
    # vLLM's API server forks its EngineCore, which sets its title; the dump's note names its pid.
    proc = subprocess.Popen(["bash", "-c", "(exec -a VLLM::EngineCore sleep 30) & wait"])
    try:
        wait_until(lambda: core_pid(proc.pid, "VLLM::EngineCore") is not None, 10, what="the titled child")
        found = core_pid(proc.pid, "VLLM::EngineCore")
        assert found is not None and found != proc.pid
        assert core_pid(proc.pid, "sglang::scheduler") is None
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
