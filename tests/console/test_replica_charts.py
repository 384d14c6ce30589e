"""The Replicas page's charts when there is little or nothing to draw: each missing series is said in its chart's
place, never drawn as an empty frame. (Charts with data: ``test_pages.test_replicas_page``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.wire import ReplicaState
from tests.console.served import charts, open_console, serve, texts
from tests.remediation.fleet import GIB, Fleet, SimAgent, SimReplica

MIB = 2**20


def test_a_replica_that_never_served_says_which_series_it_lacks(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # r0 has been in backoff all along (no engine readings); GPU 0's backend cannot read its temperature; r1
    # serves on no GPU at all.
    agent = SimAgent("gpu-a", [SimReplica("r0", state=ReplicaState.BACKOFF), SimReplica("r1", gpus=[])],
                     temperature=None)
    with serve(tmp_path, [agent], lambda f: f.run(30)) as url:
        at = open_console(monkeypatch, url, "op", page="views/replicas.py")
        said = texts(at)
        for what in ("time to first token", "inter-token latency", "end-to-end latency", "token rate", "queue"):
            assert f"No {what} in this window: the engine was not serving" in said, what
        assert "GPU 0 temperature (°C); dashed: it slows down at 89 °C" in said
        assert "No temperature recorded for GPU 0 in this window." in said
        # What the agent still read, of the engine's processes, is the one chart.
        [(_, [memory])] = charts(at)
        assert set(memory["series"]) == {"RSS"}

        at.selectbox(key="chart_replica").select("gpu-a/r1").run()
        assert not at.exception
        said = texts(at)
        assert "This replica lists no GPU: no temperature to chart." in said and "temperature (°C)" not in said
        # Serving, so its latency is drawn: the p99 alone, as the fleet's agent reads no other quantile.
        drawn = charts(at)
        assert len(drawn) == 5 and set(drawn[0][1][0]["series"]) == {"p99"}


def test_a_replica_just_reported_charts_its_gpu_but_not_yet_its_series(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    agent = SimAgent("gpu-a", [SimReplica("r0")])
    with serve(tmp_path, [agent], lambda f: f.step()) as url:
        at = open_console(monkeypatch, url, "op", page="views/replicas.py")
        assert "Not enough samples of this replica for a chart yet." in texts(at)
        [(spec, layers)] = charts(at)  # the GPU's one reading, under its slowdown rule
        assert "layer" in spec and {60.0, 89.0} == {v for f in layers for v in f["value"]}


def test_a_leaking_replica_is_projected_to_its_hosts_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # RSS climbs 8 MiB a report (2,880 MiB an hour) on a 64 GiB host; its GPU memory holds still under 141 GiB.
    agent = SimAgent("gpu-a", [SimReplica("r0", rss=56 * GIB, gpu_memory=100 * GIB)], memory_total=64 * GIB)

    def build(f: Fleet) -> None:
        for _ in range(90):
            agent.replica("r0").rss += 8 * MIB
            f.step()

    with serve(tmp_path, [agent], build) as url:
        at = open_console(monkeypatch, url, "op", page="views/replicas.py")
        said = texts(at)
        assert "RSS of the engine's processes (MiB), against the host's 64 GiB" in said
        # 64 GiB less the trend's 56 GiB and 720 MiB, at 2,880 MiB an hour.
        assert "RSS grows 2.8 GiB/h; reaches the host's 64 GiB in 2 h 35 min" in said
        assert "GPU memory: no growth in this window; the limit is the GPU's 141 GiB" in said
        drawn = {tuple(sorted(set(frames[0].get("series", ())))): (spec, frames) for spec, frames in charts(at)}
        spec, layers = drawn[("RSS",)]
        assert "layer" in spec
        [trend] = [f for f in layers if "trend" in f.columns]
        [limit] = [f["value"].tolist() for f in layers if "limit" in f.columns]
        assert limit == [64 * 1024.0]
        # From the trend's level at the last report, as far ahead as the readings reach back (under the limit).
        assert trend["value"].iloc[0] == pytest.approx(56 * 1024 + 720) and trend["value"].iloc[1] < 64 * 1024
        ahead, behind = trend["at"].iloc[1] - trend["at"].iloc[0], trend["at"].iloc[0] - layers[0]["at"].min()
        assert abs(ahead - behind).total_seconds() < 1
        _, gpu_layers = drawn[("GPU memory",)]
        assert not [f for f in gpu_layers if "trend" in f.columns]
        assert [f["value"].tolist() for f in gpu_layers if "limit" in f.columns] == [[141 * 1024.0]]
