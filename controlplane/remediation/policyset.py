"""The policies the leader runs: the shipped defaults plus configured directories, reloaded when files change.

A broken file never stops automation: its errors (file, line, field) are kept for ``GET /v1/policies`` and
the log, and the last set that loaded keeps running until the files are fixed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from controlplane.config import ServerConfig
from controlplane.policy.loader import PolicyError, PolicyLoadError
from controlplane.policy.policy import Policy
from controlplane.policy_files import DEFAULTS_DIR, load_files, policy_files

log = logging.getLogger(__name__)
Signature = tuple[tuple[str, float, int], ...]


def sources_of(config: ServerConfig) -> list[Path]:
    """The directories (or files) policies come from, in override order."""
    dirs = [DEFAULTS_DIR] if config.policy_defaults else []
    dirs += [Path(d) for d in ([config.policy_dir] if config.policy_dir else []) + list(config.policy_dirs)]
    return dirs


def _files(sources: Sequence[Path]) -> list[Path]:
    return [f for s in sources for f in (policy_files(s) if s.is_dir() else [s])]


def _signature(files: Sequence[Path]) -> Signature:
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_mtime, st.st_size))
        except OSError:
            out.append((str(f), -1.0, -1))
    return tuple(out)


def merge(groups: Sequence[Sequence[Policy]]) -> list[Policy]:
    """Later groups override earlier ones by name (a configured ``stall`` replaces the shipped one)."""
    merged: dict[str, Policy] = {}
    for group in groups:
        for policy in group:
            merged.pop(policy.name, None)
            merged[policy.name] = policy
    return list(merged.values())


@dataclass
class PolicySet:
    """The loaded policies, the last load's errors, and when the set last changed."""

    sources: list[Path]
    policies: list[Policy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)
    loaded_at: datetime | None = None
    files: list[str] = field(default_factory=list)
    _signature: Signature | None = None
    # The leader's job and API requests (explain, list) both refresh: one at a time.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @classmethod
    def from_config(cls, config: ServerConfig) -> PolicySet:
        return cls(sources=sources_of(config))

    @property
    def by_name(self) -> dict[str, Policy]:
        return {p.name: p for p in self.policies}

    def refresh(self, now: datetime) -> bool:
        """Reload when any file changed; True when the running set changed. Errors keep the last good set."""
        with self._lock:
            return self._refresh(now)

    def _refresh(self, now: datetime) -> bool:
        files = _files(self.sources)
        signature = _signature(files)
        if signature == self._signature:
            return False
        self._signature = signature
        errors: list[PolicyError] = []
        groups: list[list[Policy]] = []
        for source in self.sources:
            if not source.exists():
                errors.append(PolicyError(str(source), 0, "", "policy directory does not exist"))
                continue
            try:
                groups.append(load_files(_files([source])))
            except PolicyLoadError as exc:
                errors.extend(exc.errors)
        self.errors = errors
        if errors:
            for error in errors:
                log.error("policy file rejected, keeping the last good set: %s", error)
            if self.loaded_at is not None:
                return False
            # Nothing loaded yet: run the sources that are valid rather than nothing at all.
        self.policies = merge(groups)
        self.files = [str(f) for f in files]
        self.loaded_at = now
        log.info("loaded %d policies from %d file(s)", len(self.policies), len(files))
        return True
