"""The replica settings of the container runtime (``runtime: container``), checked as ``pitstop agent --check``
checks every other setting: each problem names its field (and so its line in ``agent.yaml``).

Kept apart from ``agent.config`` so the rules of one runtime read in one place; ``agent.config`` calls
``check_container_settings`` from the replica's model check.
"""

from __future__ import annotations

import re

# Docker's own forms: a byte count, or a number with b, k, m or g (powers of 1024), as ``--shm-size 16g``.
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
# HOST:CONTAINER[:OPTIONS]; HOST an absolute path or a named volume, OPTIONS a comma list Docker accepts.
_VOLUME_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_VOLUME_OPTIONS = frozenset({"ro", "rw", "z", "Z", "shared", "slave", "private", "rshared", "rslave", "rprivate"})
CONTAINER_ONLY = ("image", "volumes", "shm_size", "ipc", "network")


class FieldError(ValueError):
    """A problem with one field: ``field`` is its name in the replica's settings (``volumes.1`` for an item)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def size_bytes(value: int | str) -> int:
    """``16g``, ``512m``, ``1073741824``: bytes. ValueError names the forms it takes."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{value}: a size must be above 0")
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"{value!r}: a size is a byte count or a number with k, m or g (as Docker's --shm-size: "
                         "16g)")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"{value!r}: a size must be above 0")
    return size


def check_volume(spec: str) -> None:
    """``HOST:CONTAINER[:ro]`` as Docker writes it; ValueError says which part is wrong."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{spec!r}: a volume is HOST:CONTAINER or HOST:CONTAINER:OPTIONS (e.g. "
                         "/models:/root/.cache/huggingface:ro)")
    host, inside = parts[0], parts[1]
    if not (host.startswith("/") or _VOLUME_NAME.match(host)):
        raise ValueError(f"{spec!r}: {host!r} is neither an absolute host path nor a volume name")
    if not inside.startswith("/"):
        raise ValueError(f"{spec!r}: the path in the container, {inside!r}, must be absolute")
    if len(parts) == 3:
        unknown = [o for o in parts[2].split(",") if o not in _VOLUME_OPTIONS]
        if unknown:
            raise ValueError(f"{spec!r}: unknown volume option {unknown[0]!r} (ro, rw, z, Z, or a propagation)")


def check_container_settings(runtime: str, url: str | None, image: str | None, volumes: list[str],
                             shm_size: int | str | None, ipc: str | None, live_limits: bool,
                             given: set[str]) -> None:
    """Raise ``FieldError`` for the first setting the replica's runtime cannot take. ``given``: the fields the
    file set."""
    if runtime != "container":
        named = [f for f in CONTAINER_ONLY if f in given]
        if named:
            raise FieldError(f"{named[0]!r} is a setting of the container runtime: add 'runtime: container' or "
                             "remove it", named[0])
        return
    if url is not None:
        raise FieldError("'runtime: container' is for an engine the agent starts: an attached replica ('url') "
                         "runs wherever it runs", "runtime")
    if not image:
        raise FieldError("'runtime: container' needs 'image' (for example vllm/vllm-openai:v0.11.0)", "image")
    for i, volume in enumerate(volumes):
        try:
            check_volume(volume)
        except ValueError as exc:
            raise FieldError(str(exc), f"volumes.{i}") from None
    if shm_size is not None:
        try:
            size_bytes(shm_size)
        except ValueError as exc:
            raise FieldError(str(exc), "shm_size") from None
        if ipc == "host":
            raise FieldError("'shm_size' cannot be set with 'ipc: host': the container uses the host's /dev/shm",
                             "shm_size")
    if live_limits:
        raise FieldError("live_limits is not yet available with 'runtime: container': the plug-in's cap file "
                         "lives in the agent's state directory, which the container does not see", "live_limits")
