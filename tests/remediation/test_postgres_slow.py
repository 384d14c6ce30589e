"""The loop's key flows again on PostgreSQL (the several-control-planes store): same tests, other database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import tests.remediation.fleet as sim_fleet
from tests.controlplane import pg
from tests.remediation import test_flag_rungs, test_guarded_flows, test_loop

pytestmark = pytest.mark.slow

FLOWS: list[Callable[[Path], None]] = [
    test_loop.test_a_stalled_replica_is_restarted_with_its_log_tail_kept_and_succeeds_when_ready,
    test_loop.test_an_itl_breach_lowers_max_num_seqs_on_a_canary_then_rolls_it_to_the_peers,
    test_loop.test_a_canary_worse_than_its_peers_is_rolled_back,
    test_flag_rungs.test_a_rung_that_does_not_help_is_taken_back_and_the_next_rung_follows,
    test_loop.test_a_hardware_xid_cordons_the_node_and_pages_until_an_operator_uncordons,
    test_guarded_flows.test_failures_trip_the_breaker_until_an_operator_resets_it,
    test_guarded_flows.test_a_rolling_restart_goes_one_at_a_time_and_resumes_after_a_control_plane_restart,
]


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    reason = pg.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg.postgres_server() as address:
        yield address


@pytest.mark.parametrize("flow", FLOWS, ids=[f.__name__.removeprefix("test_") for f in FLOWS])
def test_flow_on_postgresql(flow: Callable[[Path], None], postgres: str, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    original = sim_fleet.server_config
    with pg.fresh_database(postgres) as url:
        def on_postgres(path: Path, **overrides: Any) -> Any:
            return original(path, **{"database_url": url, **overrides})

        monkeypatch.setattr(sim_fleet, "server_config", on_postgres)
        flow(tmp_path)
