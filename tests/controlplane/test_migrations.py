"""Migrations: from an empty database to head, and from the previous revision with data in it."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

from controlplane.store.db import current_revision, downgrade, head_revision, make_engine, migrate

NEW_TABLES = {"actions", "audit_log", "alerts", "notification_deliveries", "api_tokens"}


def _a_node(conn: Connection, *, cordoned: bool) -> None:
    """Node gpu-a as the first revision's table holds it, at sequence 7."""
    conn.execute(text(
        "INSERT INTO nodes (name, hostname, agent_version, first_seen_at, last_report_at, last_sent_at, "
        "last_sequence, reports_total, status, cordoned) VALUES ('gpu-a', 'h', '0.1', '2026-11-29 12:00:00', "
        "'2026-11-29 12:00:00', '2026-11-29 12:00:00', 7, 7, 'up', :cordoned)"), {"cordoned": cordoned})


def test_up_from_empty(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine)
        assert current_revision(engine) == head_revision()
        assert set(inspect(engine).get_table_names()) >= NEW_TABLES
        migrate(engine)  # idempotent
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()


def test_up_from_the_previous_revision_keeps_the_fleet(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "0001")
        assert current_revision(engine) == "0001"
        assert not NEW_TABLES & set(inspect(engine).get_table_names())
        with engine.begin() as conn:
            _a_node(conn, cordoned=False)
        migrate(engine)
        assert current_revision(engine) == head_revision()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name, last_sequence FROM nodes")).all() == [("gpu-a", 7)]
            assert conn.execute(text("SELECT count(*) FROM actions")).scalar() == 0
    finally:
        engine.dispose()


def test_0006_adds_gpu_cordons_and_stack_dump_asks_and_goes_back_down(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "0005")
        with engine.begin() as conn:
            _a_node(conn, cordoned=True)
            conn.execute(text(
                "INSERT INTO desired_replicas (node, name, generation, engine_args, enabled, updated_at) "
                "VALUES ('gpu-a', 'r0', 3, '[]', true, '2026-11-29 12:00:00')"))
        migrate(engine, "0006")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT cordoned, cordoned_gpus FROM nodes")).one() == (True, None)
            assert conn.execute(text("SELECT generation, capture_stack_generation FROM desired_replicas")).one() \
                == (3, None)
            conn.execute(text("UPDATE nodes SET cordoned_gpus = '[3]'"))
            conn.execute(text("UPDATE desired_replicas SET capture_stack_generation = 3"))
        downgrade(engine, "0005")
        assert current_revision(engine) == "0005"
        assert "cordoned_gpus" not in {c["name"] for c in inspect(engine).get_columns("nodes")}
        assert "capture_stack_generation" not in {c["name"] for c in inspect(engine).get_columns("desired_replicas")}
        with engine.connect() as conn:  # the rest of the fleet survives the way down
            assert conn.execute(text("SELECT name, cordoned FROM nodes")).all() == [("gpu-a", True)]
            assert conn.execute(text("SELECT name, generation FROM desired_replicas")).all() == [("r0", 3)]
    finally:
        engine.dispose()


def test_0010_adds_live_caps_without_touching_the_fleet_and_goes_back_down(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        migrate(engine, "0009")
        with engine.begin() as conn:
            _a_node(conn, cordoned=False)
            conn.execute(text(
                "INSERT INTO desired_replicas (node, name, generation, engine_args, enabled, updated_at) "
                "VALUES ('gpu-a', 'r0', 3, '[\"--max-num-seqs\", \"64\"]', true, '2026-11-29 12:00:00')"))
        migrate(engine, "0010")
        with engine.begin() as conn:
            # An existing wish means no cap: the engine keeps its startup limit, and nothing restarts.
            assert conn.execute(text("SELECT generation, live_cap FROM desired_replicas")).one() == (3, None)
            conn.execute(text("UPDATE desired_replicas SET live_cap = 16"))
        assert "live_limits" in {c["name"] for c in inspect(engine).get_columns("replicas")}
        downgrade(engine, "0009")
        assert "live_cap" not in {c["name"] for c in inspect(engine).get_columns("desired_replicas")}
        assert "live_limits" not in {c["name"] for c in inspect(engine).get_columns("replicas")}
        with engine.connect() as conn:
            assert conn.execute(text("SELECT name, generation FROM desired_replicas")).all() == [("r0", 3)]
    finally:
        engine.dispose()


def _old_sample(conn: Connection, node: str, kind: str, subject: str, at: str, width: int, values: str) -> None:
    conn.execute(text(
        "INSERT INTO samples (node, subject_kind, subject, at, resolution_seconds, \"values\") "
        "VALUES (:node, :kind, :subject, :at, :width, :values)"),
        {"node": node, "kind": kind, "subject": subject, "at": at, "width": width, "values": values})


def test_0012_packs_each_node_instant_into_one_row_keeping_every_point_and_goes_back_down(db_url: str) -> None:
    from controlplane.store.packing import unpack

    engine = make_engine(db_url)
    try:
        migrate(engine, "0011")
        with engine.begin() as conn:
            at, later = "2026-11-29 12:00:00", "2026-11-29 12:00:05"
            _old_sample(conn, "gpu-a", "replica", "r0", at, 0, '{"ttft_p99_seconds": 0.25, "generation": 3.0}')
            _old_sample(conn, "gpu-a", "gpu", "0", at, 0,
                        '{"temperature_celsius": 61.0, "throttle_reasons": ["sw_power_cap"]}')
            _old_sample(conn, "gpu-a", "replica", "r0", later, 0, '{"ttft_p99_seconds": 0.5}')
            _old_sample(conn, "gpu-a", "replica", "r0", at, 60, '{"ttft_p99_seconds": 0.3}')  # a bucket, same start
            _old_sample(conn, "gpu-b", "replica", "r0", at, 0, '{"ttft_p99_seconds": 0.125}')
        migrate(engine, "0012")
        assert "samples" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT node, at, resolution_seconds, data FROM node_samples "
                                     "ORDER BY node, at, resolution_seconds")).all()
        packed = [(node, str(at)[:19], width, unpack(bytes(data))) for node, at, width, data in rows]
        assert packed == [
            ("gpu-a", at, 0, [("replica", "r0", {"ttft_p99_seconds": 0.25, "generation": 3.0}),
                              ("gpu", "0", {"temperature_celsius": 61.0, "throttle_reasons": ["sw_power_cap"]})]),
            ("gpu-a", at, 60, [("replica", "r0", {"ttft_p99_seconds": 0.3})]),
            ("gpu-a", later, 0, [("replica", "r0", {"ttft_p99_seconds": 0.5})]),
            ("gpu-b", at, 0, [("replica", "r0", {"ttft_p99_seconds": 0.125})]),
        ]
        downgrade(engine, "0011")
        assert "node_samples" not in inspect(engine).get_table_names()
        with engine.connect() as conn:
            back = conn.execute(text("SELECT node, subject_kind, subject, resolution_seconds FROM samples "
                                     "ORDER BY node, subject_kind, subject, at, resolution_seconds")).all()
        assert back == [("gpu-a", "gpu", "0", 0), ("gpu-a", "replica", "r0", 0), ("gpu-a", "replica", "r0", 60),
                        ("gpu-a", "replica", "r0", 0), ("gpu-b", "replica", "r0", 0)]
    finally:
        engine.dispose()


def test_0013_going_down_repacks_rows_for_the_builds_before_format_2_and_loses_none(db_url: str) -> None:
    from controlplane.store import packing

    before = [("replica", "r0", {"ttft_p99_seconds": 0.25, "generation": 3.0, "rss_bytes": 2.0**33 + 1,
                                 "window": {"seconds": 5.0}}),
              ("gpu", "0", {"temperature_celsius": 61.0, "throttle_reasons": ["sw_power_cap"]})]
    older = [("replica", "r0", {"ttft_p99_seconds": 0.5})]
    engine = make_engine(db_url)
    try:
        migrate(engine)
        with engine.begin() as conn:
            for i, data in enumerate([packing.pack(before), packing.pack_format_1(older), b"\x02not zlib"]):
                conn.execute(text("INSERT INTO node_samples (node, at, resolution_seconds, data) "
                                  "VALUES ('gpu-a', :at, 0, :data)"), {"at": f"2026-11-29 12:00:0{i}", "data": data})
        downgrade(engine, "0012")
        with engine.connect() as conn:
            rows = [bytes(data) for (data,) in conn.execute(text("SELECT data FROM node_samples ORDER BY at"))]
        assert [row[0] for row in rows] == [packing.FORMAT_1, packing.FORMAT_1, packing.FORMAT]
        assert [packing.unpack(row) for row in rows[:2]] == [before, older]
        assert rows[2] == b"\x02not zlib"  # unreadable in any format: left as it was
        migrate(engine)
        assert current_revision(engine) == head_revision()
    finally:
        engine.dispose()
