"""The files Pitstop ships beside its code: Grafana dashboards, Prometheus rules and Alertmanager config, runbooks,
and the systemd units with sample configs.

The repository's top-level ``dashboards/``, ``alerts/``, ``runbooks/`` and ``deploy/`` are the only copy. This
package holds a symbolic link to each (``pitstop/share/dashboards -> ../../dashboards``), so the wheel carries
their files as package data and a checkout, an editable install and an installed wheel all find them here,
through ``importlib.resources``, whatever the current directory. The default remediation policies are package
data of ``controlplane.policy`` (``controlplane.policy_files.DEFAULTS_DIR``).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

Folder = Literal["dashboards", "alerts", "runbooks", "deploy"]
FOLDERS: tuple[Folder, ...] = ("dashboards", "alerts", "runbooks", "deploy")


class MissingShareError(LookupError):
    """A shipped folder that is not on disk (an install that left its package data out, or a zipped one)."""


def folder(name: Folder) -> Path:
    """The directory of shipped ``name`` files, resolved (in a checkout: the top-level folder itself)."""
    found = resources.files(__name__) / name
    # Prometheus, Grafana's provisioning and the policy reloader need a real directory, not a zip member.
    if not isinstance(found, Path) or not found.is_dir():
        raise MissingShareError(f"the shipped {name}/ folder is not installed (looked in {found}): reinstall "
                                "Pitstop from its wheel, or from a checkout with pitstop/share/ intact")
    return found.resolve()
