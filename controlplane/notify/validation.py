"""What every model of the notifier's config shares: the base model, the errors its validators raise, checked strings.

Inputs may hold secrets, so every model keeps its input out of ``ValidationError``'s text, and the errors built
here carry none: a secret beside a mistake never reaches a log through them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Loc = tuple[str | int, ...]


class ConfigModel(BaseModel):
    """Frozen, unknown keys refused, inputs kept out of errors: the base of every ``notifier:`` model."""

    # Inputs may hold secrets: keep them out of ValidationError's text (the outermost model's setting counts).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def invalid(problems: Sequence[tuple[Loc, str]]) -> ValidationError:
    """A ValidationError at locations below the model being validated, so each problem names its own field.

    Raised inside a validator, pydantic prefixes the enclosing locations (``notifier``...), as for its own
    errors. The errors carry no input, so a secret beside the mistake never reaches a log through them.
    """
    return ValidationError.from_exception_data(
        "notifier", [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)
                     for loc, message in problems])


def refuse(message: str, loc: Loc = ()) -> ValidationError:
    """``invalid`` for one problem."""
    return invalid([(loc, message)])


def is_http_url(value: str) -> bool:
    """Absolute http(s) URL with a host: what a receiver can POST to."""
    try:
        parts = urlsplit(value)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def _http_url(value: str) -> str:
    if not is_http_url(value):
        raise ValueError(f"expected an absolute http:// or https:// URL, got {value!r}")
    return value


def _external_url(value: str) -> str:
    _http_url(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment:
        raise ValueError("the console's base URL takes no query or fragment")
    return value.rstrip("/")


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits and _)")
    return value


def _file_path(value: str) -> str:
    if not value.strip():
        raise ValueError("empty path")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
# The console's base URL as people reach it (behind the load balancer), without its trailing slash.
ExternalUrl = Annotated[str, AfterValidator(_external_url)]
EnvName = Annotated[str, AfterValidator(_env_name)]
FilePath = Annotated[str, AfterValidator(_file_path)]
