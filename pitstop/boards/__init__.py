"""The Grafana dashboards in ``dashboards/``, generated from code: ``python -m pitstop.boards [--check]``.

``build`` returns every board's JSON model from the inputs (the shipped policies' SLO targets and the alert
names of ``alerts/pitstop-rules.yml``); ``dump`` is the committed file's text. The JSON files are committed so
Grafana can provision them as they are; ``--check`` fails when they differ from what this code generates.
"""

from __future__ import annotations

import json
from typing import Any

from pitstop.boards import fleet, gpu, replica
from pitstop.boards.grafana import render
from pitstop.boards.inputs import Inputs

BOARDS = (fleet, gpu, replica)


def build(inputs: Inputs) -> dict[str, dict[str, Any]]:
    """File name (``pitstop-fleet.json``) -> dashboard JSON model, for every board."""
    boards = [render(module.board(inputs)) for module in BOARDS]
    return {f"{b['uid']}.json": b for b in boards}


def dump(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"
