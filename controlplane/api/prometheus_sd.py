"""``GET /v1/prometheus/targets``: Prometheus's HTTP service discovery over the fleet (any reader's token).

Prometheus polls it (``http_sd_configs``, ``refresh_interval``) and keeps the last good answer while the control
plane is away, so a control-plane outage never empties the scrape targets. alerts/README.md shows the scrape
configuration; ``controlplane.fleet.prometheus_targets`` builds the answer.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from controlplane.api.context import Db, require_reader
from controlplane.fleet.prometheus_targets import Job, read_targets

router = APIRouter(prefix="/v1/prometheus", tags=["prometheus"], dependencies=[Depends(require_reader)])


@router.get("/targets", summary="Scrape targets in Prometheus's http_sd format: agents, or engines through them")
def targets(session: Db, job: Annotated[Job, Query(description="pitstop-agent: each node's agent; pitstop-engines: "
                                                            "each replica's engine /metrics through its agent")]
            ) -> list[dict[str, object]]:
    return read_targets(session, job)
