"""An engine's log: written by the engine, tailed in bounded reads and rotated (copy, then truncate in place) by
the agent; its pid file tells a leftover engine from a reused pid."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.engine_log import EngineLog, LogTail, last_lines, open_for_engine
from agent.pidfile import PidFile


def _engine_writes(path: Path) -> int:
    """The descriptor an engine writes through, as the agent opens it at spawn."""
    return open_for_engine(path)


def test_log_rotates_past_the_cap_and_keeps_n_backups(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "r1.log"
    out = _engine_writes(path)
    log = EngineLog(path, max_bytes=100, backups=2)
    for n in range(10):
        os.write(out, f"line {n:02d} ".encode() * 5 + b"\n")  # 41 bytes a line
        log.check()
    os.write(out, b"after the last rotation\n")  # O_APPEND: the engine's next write lands in the emptied file
    os.close(out)
    log.close()
    files = sorted(p.name for p in path.parent.iterdir())
    assert files == ["r1.log", "r1.log.1", "r1.log.2"]
    assert all(p.stat().st_size <= 100 + 41 for p in path.parent.iterdir())  # the cap, plus one check's writes
    assert path.read_bytes().startswith(b"line 09 ")  # no hole of zeros where the truncated bytes were
    assert path.read_text().endswith("after the last rotation\n")  # the newest lines are in the live file
    every = "".join(p.read_text() for p in path.parent.iterdir())
    assert "line 00" not in every  # the oldest were dropped
    assert every.count("line 08") == 5  # nothing written twice across the copies
    assert log.tail()[-2:] == ["line 09 " * 5, "after the last rotation"]  # the tail spans the rotation


def test_the_tail_is_this_engines_lines_read_from_the_last_offset(tmp_path: Path) -> None:
    path = tmp_path / "r1.log"
    path.write_text("the previous engine's last words\n")
    out = _engine_writes(path)
    tail = LogTail(path, from_end=True, lines=3)
    assert tail.read() == []
    os.write(out, b"one\ntwo\nthree\nfou")
    assert tail.read() == ["one", "two", "three", "fou"]  # an unfinished line comes last
    os.write(out, b"r\nfive\n")
    assert tail.read() == ["three", "four", "five"]
    assert tail.read() == ["three", "four", "five"]  # nothing new: nothing changes
    os.close(out)
    tail.close()


def test_a_burst_is_read_in_one_bounded_step_and_only_its_end_kept(tmp_path: Path) -> None:
    path = tmp_path / "r1.log"
    out = _engine_writes(path)
    tail = LogTail(path, from_end=True, lines=2, window=100)
    os.write(out, b"".join(f"burst line {n:04d}\n".encode() for n in range(10_000)))  # 170 kB at once
    assert tail.read() == ["burst line 9998", "burst line 9999"]
    os.write(out, b"x" * 500)  # one line longer than the window: its end is kept, not its start
    lines = tail.read()
    assert lines[-1] == "x" * 100
    os.close(out)
    tail.close()


def test_a_file_truncated_from_outside_is_read_again_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "r1.log"
    out = _engine_writes(path)
    tail = LogTail(path, from_end=True)
    os.write(out, b"before\n" * 20)
    assert tail.read()[-1] == "before"
    os.truncate(path, 0)  # logrotate's copytruncate
    os.write(out, b"after\n")
    assert tail.read()[-2:] == ["before", "after"]
    os.close(out)
    tail.close()


def test_the_tail_follows_the_engines_file_when_its_name_is_moved(tmp_path: Path) -> None:
    path = tmp_path / "r1.log"
    out = _engine_writes(path)
    log = EngineLog(path, max_bytes=100, backups=1)
    path.rename(tmp_path / "r1.log.moved")  # a rename-style rotation: the engine writes on into the moved file
    os.write(out, b"still here\n" * 20)
    assert log.check() is False  # the name is no longer the engine's file: not ours to rotate
    assert log.tail()[-1] == "still here"
    os.close(out)
    log.close()


def test_last_lines_of_a_file_a_previous_engine_wrote(tmp_path: Path) -> None:
    path = tmp_path / "r1.log"
    assert last_lines(path) == []
    path.write_text("".join(f"line {n}\n" for n in range(100)))
    assert last_lines(path, lines=2) == ["line 98", "line 99"]


def test_pid_file_recognises_the_same_process_only(tmp_path: Path) -> None:
    pidfile = PidFile(tmp_path / "run" / "r1.pid")
    assert pidfile.leftover() is None
    pidfile.write(os.getpid())
    assert pidfile.leftover() == os.getpid()
    # Same pid, different create time: the pid was reused by an unrelated process; leave it alone.
    data = json.loads(pidfile.path.read_text())
    pidfile.path.write_text(json.dumps({**data, "create_time": data["create_time"] - 1000}))
    assert pidfile.leftover() is None
    pidfile.clear()
    assert not pidfile.path.exists()
